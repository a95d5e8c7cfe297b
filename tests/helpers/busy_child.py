"""A real signal to the real CLI at a moment it is busy writing. The child runs `tinyrl ARGS` with
one function (or method) made to pause right after its CALL_NO-th call (a file half of an output already
written, the rest not yet): it creates MARKER, then sleeps in Python, so the signal's handler
runs there. The parent (`interrupt_when_busy`) waits for MARKER and sends the signal.

    python busy_child.py MODULE:ATTR CALL_NO MARKER TINYRL_ARGS...   (ATTR: a name or CLASS.METHOD)
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def interrupt_when_busy(target: str, call_no: int, args: list[str], marker: Path,
                        sig: int = signal.SIGINT) -> subprocess.CompletedProcess:
    """Run the CLI under the paused `target` (MODULE:ATTR), signal it once paused; its result."""
    proc = subprocess.Popen([sys.executable, __file__, target, str(call_no), str(marker), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    deadline = time.monotonic() + 300
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is None and marker.exists():
        proc.send_signal(sig)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert marker.exists(), f"the command never reached {target} call {call_no}:\n{stderr[-3000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _pause_after(owner, attr: str, call_no: int, marker: Path) -> None:
    real, calls = getattr(owner, attr), []

    def paused(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(None)
        if len(calls) == call_no:
            marker.touch()
            time.sleep(120)  # the parent's signal ends this; a sleep, so Python runs the handler
        return result
    setattr(owner, attr, paused)


if __name__ == "__main__":
    from tinyrl.cli import main  # first: tinyrl's import set-up (torchvision kept out) before the target's

    target, call_no, marker, *cli_args = sys.argv[1:]
    module_name, path = target.split(":")
    owner = importlib.import_module(module_name)
    *owners, attr = path.split(".")  # ATTR may be CLASS.METHOD
    for name in owners:
        owner = getattr(owner, name)
    _pause_after(owner, attr, int(call_no), Path(marker))
    sys.argv = ["tinyrl", *cli_args]
    main()
