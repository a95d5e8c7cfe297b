"""JSON-lines files that a crash or a full disk cannot break.

Writing: one record is one `os.write` of the whole line on an O_APPEND descriptor. If the write
fails or writes only part of the line (ENOSPC, EDQUOT, EFBIG), the file is cut back to its
length before the write, so a failed append leaves no half line behind; the caller gets the
OSError and decides (the run log keeps the line and retries later).
Reading: a last line without its newline (a machine crash mid-write, a file copied while
written) is dropped with a note; a bad line anywhere else is an error, because then the file
is not what we think it is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tinyrl.errors import TinyRLError


def append_line(path: Path, line: str) -> None:
    """Append `line` + newline whole, or raise OSError with the file as it was."""
    data = (line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        before = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):  # a short write: the disk filled up part-way
                raise OSError(28, f"short write to {path} ({written} of {len(data)} bytes)")
        except OSError:
            try:
                os.ftruncate(fd, before)  # cutting back frees blocks, so it works on a full disk
            except OSError:
                pass  # the reader drops a torn last line, and repair_tail() fixes it on resume
            raise
    finally:
        os.close(fd)


def append_record(path: Path, record: dict) -> None:
    append_line(path, json.dumps(record))


def read_records(path: Path, notes: list[str] | None = None) -> list[dict]:
    """The records of a .jsonl file; a torn last line is dropped (noted in `notes`)."""
    lines = path.read_text(errors="replace").split("\n")
    records = []
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    for i, (n, line) in enumerate(numbered):
        last = i == len(numbered) - 1
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            if last:
                if notes is not None:
                    notes.append(f"{path.name}: dropped a cut-off last line (line {n})")
                continue
            raise TinyRLError(f"{path} line {n} is not JSON ({exc.msg})",
                              hint="fix or delete that line; a run killed mid-write only ever cuts the last one") from exc
        if not isinstance(rec, dict):
            raise TinyRLError(f"{path} line {n} is not a JSON object",
                              hint="each line must be one object, e.g. {\"step\": 1, \"reward/mean\": 0.1}")
        records.append(rec)
    return records


def repair_tail(path: Path) -> bool:
    """Cut an unterminated last line off `path` (before appending to it again). True if cut."""
    if not path.exists():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    keep = data.rfind(b"\n") + 1
    with open(path, "r+b") as fh:
        fh.truncate(keep)
    return True


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` through a temporary file: a crash or a full disk leaves the old
    file whole (the temporary one is removed on failure)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
