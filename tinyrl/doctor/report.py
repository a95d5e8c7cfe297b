"""The doctor's report: rows, the exit code, the JSON a user attaches to a bug report."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

STATUSES = ("pass", "warn", "fail", "skipped")
BASES = ("measured", "simulated", "simulated vs measured", "read", "")


@dataclass
class Row:
    name: str
    status: str            # pass | warn | fail | skipped
    found: str             # what was found, in words (figures included)
    fix: str = ""          # what to do; every failure has one
    basis: str = ""        # measured | simulated | simulated vs measured | read | "" (skipped)
    reason: str = ""       # skipped: why ("no CUDA")
    data: dict = field(default_factory=dict)  # the figures behind `found`, for the JSON

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status
        assert self.basis in BASES, self.basis
        assert self.status != "fail" or self.fix, f"{self.name}: a failure needs a fix"

    @property
    def label(self) -> str:
        return f"skipped: {self.reason}" if self.status == "skipped" and self.reason else self.status


def skipped(name: str, reason: str, found: str = "", **data) -> Row:
    return Row(name, "skipped", found, reason=reason, data=data)


@dataclass
class Report:
    preset: str  # --preset as given (a file's path too): `tinyrl doctor --preset ...` repeats it
    overrides: list[str]
    machine: dict
    rows: list[Row] = field(default_factory=list)
    bench: dict | None = None
    workdir_kept: str | None = None

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.rows if r.status == "fail"]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def to_dict(self) -> dict:
        from tinyrl import __version__ as version

        return {"tool": "tinyrl doctor", "tinyrl": version, "preset": self.preset, "overrides": self.overrides,
                "machine": self.machine, "exit_code": self.exit_code, "failed": self.failed,
                "rows": [{**asdict(r), "status_text": r.label} for r in self.rows], "bench": self.bench}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)
