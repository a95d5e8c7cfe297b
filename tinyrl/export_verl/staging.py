"""All or nothing: export-verl writes its files into a staging directory beside --out and moves
them into --out only when every one is written. A failure on the way (a TinyRLError found after
the first file, a full disk, a directory it may not write) leaves --out as it was: no half
export, and nothing a re-run would then refuse as "not empty". (A process killed outright
leaves only the hidden staging directory, .OUT.export-verl-*, beside --out.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from tinyrl.errors import TinyRLError

_REPLACED = ".tinyrl-replaced"  # inside the staging directory: the files of --out a move replaced


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """Yield an empty directory beside `out` to write the export into. On a clean exit each of
    its files moves to the same place under `out` (replacing a file of that name: check_out_dir
    allowed that with --overwrite; other files in `out` are left alone). On any exception the
    staged files, and every directory made for them, are removed; an OSError becomes a
    TinyRLError saying that nothing was changed."""
    real = out.resolve()  # `.` has no name, and a link's target is where the files go
    made: list[Path] = []  # directories this export created, outermost first
    stage = None
    try:
        _mkdirs(real.parent, made)
        stage = Path(tempfile.mkdtemp(prefix=f".{real.name}.export-verl-", dir=real.parent))
        yield stage
        _move_all(stage, real, made)
    except BaseException as exc:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        _remove_empty(made)  # after the staging directory: it may sit in one of them
        if isinstance(exc, OSError):
            raise TinyRLError(f"export-verl stopped: {exc}; nothing was changed in {out}",
                              hint="check that the directory is writable and its disk has room (df -h), "
                                   "then run the same command again") from exc
        raise
    shutil.rmtree(stage, ignore_errors=True)  # what is left: the files of --out it replaced


def _mkdirs(path: Path, made: list[Path]) -> None:
    """mkdir -p, recording each directory it creates."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        d.mkdir()
        made.append(d)


def _remove_empty(made: list[Path]) -> None:
    for d in reversed(made):
        with contextlib.suppress(OSError):  # not empty: something else wrote there meanwhile
            d.rmdir()


def _move_all(stage: Path, out: Path, made: list[Path]) -> None:
    files = sorted(p.relative_to(stage) for p in stage.rglob("*") if not p.is_dir())
    blocked = [str(out / rel) for rel in files if (out / rel).is_dir() and not (out / rel).is_symlink()]
    if blocked:
        raise TinyRLError("export-verl would replace directories with its files; nothing was changed:\n"
                          + "\n".join(f"  - {b}" for b in blocked), hint="move them away, or export to another --out")
    moved: list[tuple[Path, Path | None]] = []  # (placed file, the file of --out it replaced)
    try:
        for rel in files:
            dst = out / rel
            _mkdirs(dst.parent, made)
            old = None
            if dst.exists() or dst.is_symlink():
                old = stage / _REPLACED / rel
                old.parent.mkdir(parents=True, exist_ok=True)
                os.replace(dst, old)
            moved.append((dst, old))
            os.replace(stage / rel, dst)
    except BaseException:
        for dst, old in reversed(moved):  # put --out back as it was
            if old is not None:
                os.replace(old, dst)
            else:
                dst.unlink(missing_ok=True)
        raise
