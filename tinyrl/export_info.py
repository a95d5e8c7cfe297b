"""tinyrl_export.json: what `tinyrl export` records beside the merged model, written and read here.

Written last (tinyrl.export.export_run), so a model directory without it is unfinished. Its
readers: model.init_from (which run and step a starting model is), eval of an export (the run's
task), export-verl --actor (the run's base), report (a model directory is not a run).
Torch-free: report and export-verl read it without loading a model.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER = "tinyrl_export.json"


@dataclass(frozen=True)
class ExportInfo:
    run_dir: str                          # the run exported, as given to `tinyrl export`
    step: int                             # its checkpoint's step
    base: str | None = None               # its model.name; None: an export from before it was recorded
    task: dict[str, Any] | None = None    # its [task] settings; None: likewise

    def write(self, model_dir: Path) -> None:
        (Path(model_dir) / MARKER).write_text(json.dumps(dataclasses.asdict(self), indent=2))


def read_export(model_dir: str | Path) -> ExportInfo | None:
    """The record of a finished `tinyrl export` in model_dir; None for any other directory (no
    record, or one that is not tinyrl's)."""
    try:
        raw = json.loads((Path(model_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("run_dir"), str) or not isinstance(raw.get("step"), int):
        return None
    base, task = raw.get("base"), raw.get("task")
    return ExportInfo(raw["run_dir"], raw["step"], base if isinstance(base, str) else None,
                      task if isinstance(task, dict) else None)
