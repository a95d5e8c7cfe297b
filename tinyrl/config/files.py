"""Where presets and shipped data live, and how a path a user gives is found (theirs first, then
the checkout's).
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path

from tinyrl.errors import TinyRLError


REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: tinyrl/config/files.py -> ../..
PRESETS_DIR = REPO_ROOT / "presets"
DATA_DIR = REPO_ROOT / "data"


def list_presets() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PRESETS_DIR.glob("*.toml"))}


def presets_starting_from(run_dir: Path) -> list[str]:
    """`tinyrl CMD --preset NAME` for each shipped preset whose model.init_from is `run_dir` (read
    from here, as a run reads it): the demos' SFT run is met again by a second demo."""
    found = []
    for name, path in list_presets().items():
        raw = tomllib.loads(path.read_text())
        start = raw.get("model", {}).get("init_from", "")
        if start and Path(start).resolve() == run_dir.resolve():
            found.append(f"tinyrl {raw.get('command', 'train')} --preset {name}")
    return found


def _preset_path(preset: str) -> Path:
    candidate = Path(preset).expanduser()
    looks_like_path = candidate.suffix == ".toml" or "/" in preset or "\\" in preset or candidate.exists()
    presets = list_presets()
    if preset in presets:
        return presets[preset]
    if looks_like_path:
        if candidate.is_dir():
            raise TinyRLError(f"--preset {preset}: is a directory, not a .toml file",
                              hint=f"give a preset file inside it, or a preset name: {', '.join(presets)}")
        if not candidate.exists():
            raise TinyRLError(f"--preset {preset}: file not found ({candidate.absolute()})",
                              hint=f"check the path, or give a preset name: {', '.join(presets)}")
        return candidate
    near = difflib.get_close_matches(preset, presets, n=1)
    raise TinyRLError(
        f"unknown preset {preset!r}",
        hint=(f"did you mean {near[0]!r}? " if near else "")
        + f"available: {', '.join(presets)} (or a path to a .toml file)",
    )


def read_preset(path: Path) -> dict:
    """A preset file's TOML as a dict (a one-screen error when it cannot be read or parsed)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TinyRLError(f"preset file {path} is not text (not UTF-8 at byte {exc.start}); is it a TOML file?",
                          hint="give a .toml preset, e.g. a copy of presets/countdown-tiny.toml") from exc
    except OSError as exc:
        raise TinyRLError(f"cannot read preset file {path}: {exc.strerror or exc}", hint="check the path") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TinyRLError(f"preset file {path} is not valid TOML: {exc}", hint="fix the file") from exc


def resolve_path(path: str) -> Path:
    """Relative paths are relative to the working directory, or to the repo for shipped files
    (data/..., presets/...: test sets, chat templates). Only those: a generated file
    (runs/data/...) belongs to the directory the command runs in, and one that a run in the
    checkout left must not stand in for it."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    return shipped_path(p) or p


def shipped_path(path: str | Path) -> Path | None:
    """The file tinyrl ships under this relative path (REPO_ROOT/data/..., REPO_ROOT/presets/...),
    as resolve_path finds it where the path is not found from the working directory; else None."""
    shipped = REPO_ROOT / Path(path).expanduser()
    found = shipped.exists() and any(shipped.resolve().is_relative_to(d.resolve()) for d in (DATA_DIR, PRESETS_DIR))
    return shipped if found else None
