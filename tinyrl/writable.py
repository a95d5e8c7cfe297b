"""Where a command writes: checked before its work, never over a user's file, never half-written.

An `--out` that is a file, lies inside a file, or sits on a read-only disk is said at once, exit 2
with what to set: until 2026-11-26 seven commands (`eval`, `report`, `export`, `data math`,
`data retool`, `probe-memory --out`, `doctor --out`) ended in a traceback there, `eval` after
its whole evaluation, `probe-memory` after its plan, `doctor` after its two steps.

Tried for real (a file made and removed in the nearest existing directory): permission bits do
not stop root, and a read-only mount is only seen by a write (or access(2)).

Files a command creates (`tinyrl data`) are refused when already there (`refuse_existing`) and
written through a hidden staging folder (`staged`), so Ctrl-C or a full disk leaves none behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from tinyrl.errors import TinyRLError


def nearest_existing(path: Path) -> Path:
    """`path` itself, or the closest folder above it that exists (where a mkdir would start)."""
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def nearest_sibling(path: Path, candidate: Callable[[Path], bool]) -> Path | None:
    """For a mistyped `path` (runs/sfft): the entry beside it, among those `candidate` accepts,
    whose name is nearest to its name (difflib's cutoff), or None."""
    import difflib

    parent = path.parent
    names = [p.name for p in parent.iterdir() if candidate(p)] if parent.is_dir() else []
    near = difflib.get_close_matches(path.name, names, n=1)
    return parent / near[0] if near else None


# A directory --out that does not exist yet and ends so is a file name given by mistake.
FILE_SUFFIXES = {".parquet", ".jsonl", ".json", ".csv", ".png", ".txt", ".toml", ".py", ".safetensors", ".bin", ".pt",
                 ".sh", ".yaml"}


def check_writable(path: Path, flag: str = "--out", lost: str = "nothing was loaded or written",
                   example: str = "runs/my-run") -> None:
    """`path` is (or can be made) a directory this process can write in; creates nothing.
    `lost` says what did not happen (the work the check saved), `example` a directory to give."""
    where = nearest_existing(path)
    if not where.is_dir():
        what = "is a file" if where == path.expanduser().absolute() else f"is inside {where}, which is a file"
        raise TinyRLError(f"{flag} {path} {what}, not a directory; {lost}",
                          hint=f"give {flag} a directory, e.g. {flag} {example}")
    if where != path.expanduser().absolute() and path.suffix.lower() in FILE_SUFFIXES:
        # `data math --out data/aime.parquet` made a directory of that name, which train then
        # read as "a directory, not a parquet file"
        raise TinyRLError(f"{flag} {path} names a directory to create, but {path.name} looks like a file name; {lost}",
                          hint=f"give {flag} a directory, e.g. {flag} {path.parent / path.stem}"
                               + (f" (`data math` and `data retool`: --name {path.stem} names the file)"
                                  if path.suffix.lower() == ".parquet" else ""))
    try:
        handle, probe = tempfile.mkstemp(prefix=".tinyrl-write-check-", dir=where)
    except OSError as exc:
        why = "a read-only filesystem" if exc.errno == errno.EROFS else (exc.strerror or str(exc))
        raise TinyRLError(f"{flag} {path}: cannot write in {where} ({why}); {lost}",
                          hint=f"give {flag} a directory on a writable disk (e.g. under your home or /tmp)") from exc
    os.close(handle)
    os.unlink(probe)


def check_file_target(path: Path, written_before: Callable[[Path], bool], what: str, flag: str = "--out",
                      lost: str = "nothing was written", example: str = "report.json") -> None:
    """`path` can be written as a file: not a directory, its folder can be made and written, and
    a file there is one this command wrote before (`written_before`: a re-run replaces its `what`).
    Any other file is the user's: until 2026-11-27 `probe-memory --out notes.txt` and `doctor --out`
    replaced it without a word, exit 0."""
    path = path.expanduser()
    if path.is_dir():
        raise TinyRLError(f"{flag} {path} is a directory; {lost}",
                          hint=f"give {flag} a file path, e.g. {flag} {path / example}")
    if path.is_file() and not written_before(path):
        raise TinyRLError(f"{flag} {path} exists and is not a {what} tinyrl wrote; {lost}",
                          hint=f"give {flag} a new file, e.g. {flag} {example}, or move that one away "
                               f"(a {what} of an earlier run is replaced)")
    where = nearest_existing(path.parent)
    if not where.is_dir():
        raise TinyRLError(f"{flag} {path}: {where} is a file, not a directory; {lost}",
                          hint=f"give {flag} a file path in a directory, e.g. {flag} {example}")
    check_writable(path.parent, flag, lost, example)  # a read-only disk


ANOTHER_OUT = "choose another --out (or move those files away)"  # the generators' files have fixed names


def json_object_with(path: Path, key: str, value: object = None) -> bool:
    """The file holds a JSON object with `key` (equal to `value` when one is given): how a command
    knows its own earlier output, which it may replace, from a file of the user's."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and key in data and (value is None or data[key] == value)


def refuse_existing(paths, hint: str = "choose another --out or --name") -> None:
    """Files a command would create that are there already: all named, nothing written. (`tinyrl
    data countdown` and `data arith` replaced a user's own train.parquet in --out without a word
    until 2026-11-26; math and retool refused one file at a time.)"""
    there = [str(p) for p in paths if Path(p).exists()]
    if there:
        raise TinyRLError(f"{', '.join(there)} already exist{'s' if len(there) == 1 else ''}; nothing was written",
                          hint=hint)


def make_dir(path: Path, flag: str = "--out", example: str = "data/mine") -> Path:
    """check_writable, then the directory made (with its parents); -> path."""
    check_writable(path, flag, "nothing was written", example)
    try:
        path.expanduser().mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # made into a file, or the disk filled, since the check
        raise TinyRLError(f"cannot create {flag} {path}: {exc.strerror or exc}; nothing was written",
                          hint=f"give {flag} a writable directory, e.g. {flag} {example}") from exc
    return path


def place_new(src: Path, dst: Path) -> bool:
    """Move src to dst unless dst exists (then leave dst alone; -> False). os.link fails instead of
    replacing, so even a file that appears meanwhile is never overwritten."""
    try:
        os.link(src, dst)
    except FileExistsError:
        return False
    except OSError:  # a filesystem without hard links: check, then rename
        if dst.exists():
            return False
        os.replace(src, dst)
        return True
    os.unlink(src)
    return True


@contextlib.contextmanager
def staged(out: Path, replace: bool = False) -> Iterator[Path]:
    """A hidden folder in `out` to write a command's files into; they move into `out` when the body
    ends without an error, and the folder goes in any case (Ctrl-C included). So an interrupted
    `tinyrl data` leaves no half-written parquet in --out, which train would fail to read and a
    rerun would refuse to replace. `replace`: files of the same names in `out` are replaced
    (`export --overwrite`); else one that appeared meanwhile is kept and said."""
    stage = Path(tempfile.mkdtemp(prefix=".tinyrl-writing-", dir=out))
    try:
        yield stage
        for done in sorted(stage.iterdir()):
            if replace:
                os.replace(done, out / done.name)
            elif not place_new(done, out / done.name):
                raise TinyRLError(f"{out / done.name} appeared while it was written; it was kept",
                                  hint="another command writes into the same --out: give each its own")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
