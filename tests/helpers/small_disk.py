"""A real, small filesystem for full-disk tests: a tmpfs mounted for the test (needs root with
CAP_SYS_ADMIN, as in CI's container). `mount_tmpfs` returns False where mounting is not allowed;
callers then fall back to RLIMIT_FSIZE (a per-file size limit: with SIGXFSZ ignored, a write past
it fails with EFBIG, a real OS error) or skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def mount_tmpfs(where: Path, size_bytes: int, read_only: bool = False) -> bool:
    """read_only: a read-only filesystem (root included: chmod does not stop root, EROFS does)."""
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None or os.geteuid() != 0:
        return False
    options = f"size={size_bytes}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                          capture_output=True)
    return done.returncode == 0


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(where: Path, leave_bytes: int = 0) -> Path:
    """Write a filler file until only `leave_bytes` are free (0: the disk is full)."""
    filler = where / "filler.bin"
    free = shutil.disk_usage(where).free - leave_bytes
    with open(filler, "ab") as fh:
        try:
            while free > 0:
                chunk = min(free, 1 << 20)
                fh.write(b"\0" * chunk)
                fh.flush()
                free -= chunk
        except OSError:
            pass  # full
    return filler


def limit_file_size(limit_bytes: int):
    """A preexec_fn for subprocess: files the child writes may not grow past limit_bytes."""
    def apply() -> None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so the write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply
