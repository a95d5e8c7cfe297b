"""Maths answer equivalence (math-verify) with a hard time limit that is safe in any thread.

math-verify bounds its own time with SIGALRM, which only works in the main thread (and would
fight the trainer's own alarms); sympy can run for minutes on a hostile string. So the check
runs in a worker process (tinyrl/tasks/_verify_worker.py) fed through a pipe: each call waits at
most `timeout_s` for the answer, and a worker past its time is killed and replaced (the answer
counts as wrong). One worker per Verifier, calls serialised by a lock; a pipe round trip costs
~0.1 ms on top of math-verify's own time. Identical answers (after trimming spaces and `$`)
never leave the process, and answers longer than MAX_ANSWER_CHARS are wrong without a look.
"""

from __future__ import annotations

import atexit
import json
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tinyrl.errors import TinyRLError

MAX_ANSWER_CHARS = 1000    # a real final answer is short; sympy on 10 kB of LaTeX is not
STARTUP_TIMEOUT_S = 120.0  # importing sympy + math-verify on a busy machine
_WORKER = Path(__file__).with_name("_verify_worker.py")


def worker_command() -> list[str]:
    """This interpreter running the worker script, set up to import what this process imports.

    `-P`: the script's own directory (tinyrl/tasks, whose math.py would shadow the stdlib's
    `math`) is not put on sys.path. That was all `-I` was here for, but `-I` also means `-E` (no
    PYTHONPATH) and `-s` (no user site-packages): math-verify installed with `pip install
    --target DIR` + PYTHONPATH=DIR, or with `pip install --user`, passed the import check in
    this process and the worker could not import it ("did not start"; 40 tests on an H100).
    So -E, -s and -S are given only where this process runs with them: the worker's startup
    path and site set-up (.pth files, e.g. an editable install's import hook) are then built as
    this process's were. The worker also replaces its sys.path with ours (passed as its
    argument), so what was added at run time (`sys.path.insert` in a notebook) counts too.
    """
    flags = ["-P"]
    for on, flag in ((sys.flags.ignore_environment, "-E"), (sys.flags.no_user_site, "-s"),
                     (sys.flags.no_site, "-S")):
        if on:
            flags.append(flag)
    return [sys.executable, *flags, str(_WORKER)]


def normalize(text: str) -> str:
    return "".join(text.split()).strip("$").rstrip(".")


class Verifier:
    def __init__(self, timeout_s: float = 5.0):
        self.timeout_s = timeout_s
        self.timeouts = 0                 # calls that ran out of time (their worker was killed)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._stderr = None               # the worker's stderr, read back when it fails to start
        atexit.register(self.close)

    def equivalent(self, answer: str, truth: str) -> bool:
        if normalize(answer) == normalize(truth):
            return True
        if len(answer) > MAX_ANSWER_CHARS or not answer.strip():
            return False
        line = json.dumps({"a": answer, "t": truth}) + "\n"
        with self._lock:
            proc = self._start()
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
                reply = self._read(proc, self.timeout_s)
            except OSError:  # the worker died (e.g. out of memory): a fresh one next call
                reply = None
            if reply is None:
                self.timeouts += 1
                self._kill()
                return False
            return reply == "1"

    def _start(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        try:
            import math_verify  # noqa: F401 - fail here, in the parent, with an install hint
        except ImportError as e:
            raise TinyRLError(f"the maths reward needs the math-verify package ({e})",
                              hint="pip install 'math-verify>=0.9,<0.10' (a tinyrl dependency)") from e
        command = worker_command()
        # a file, not a pipe: nobody reads it while the worker runs, and a full pipe would stall it
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen([*command, json.dumps(sys.path)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1)
        if self._read(self._proc, STARTUP_TIMEOUT_S) != "ready":
            said = self._kill()
            raise TinyRLError("the math-verify worker process did not start"
                              + (": " + " | ".join(said) if said else ""),
                              hint=f"run `{' '.join(command)}` to see the whole of it")
        return self._proc

    @staticmethod
    def _read(proc: subprocess.Popen, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if ready:
                line = proc.stdout.readline()  # the worker writes whole lines, then flushes
                return line.strip() if line else None

    def _kill(self) -> list[str]:
        """Kill the worker. -> the last lines it wrote to stderr (a traceback's say why it died)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        return self._close_stderr()

    def _close_stderr(self) -> list[str]:
        """Close the worker's stderr file. -> its last three lines (read from its last 4 kB: the
        file lives as long as the worker, which may have warned all run)."""
        if self._stderr is None:
            return []
        self._stderr.seek(max(0, self._stderr.seek(0, 2) - 4096))
        said = self._stderr.read().decode(errors="replace").strip().splitlines()[-3:]
        self._stderr.close()
        self._stderr = None
        return said

    def close(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.stdin.close()  # EOF: the worker's loop ends
                try:
                    self._proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
            self._proc = None
            self._close_stderr()


_shared: dict[float, Verifier] = {}
_shared_lock = threading.Lock()


def shared_verifier(timeout_s: float = 5.0) -> Verifier:
    """One worker per time limit for the whole process (rewards, eval and tests share it)."""
    with _shared_lock:
        if timeout_s not in _shared:
            _shared[timeout_s] = Verifier(timeout_s)
        return _shared[timeout_s]
