"""A user's reward function runs in a worker process, so nothing it does can end the run quietly.

In the trainer's process, `os._exit(0)` inside a reward ended `tinyrl train` with exit code 0,
no output and no checkpoint (issue 29), and a crash in C code took the run down with it. Here
the function runs in one long-lived child (its module is imported once, so a function that
keeps state -- a cache, a loaded model -- keeps it across calls), one call at a time over a
pipe. A worker that ends without answering becomes a TinyRLError naming the function, the
sample and the worker's exit code: `tinyrl` exits 2 and the checkpoints already on disk stay.

Inside the worker each call runs exactly as it did in-process (tinyrl.rewards.registry._wrap:
the time limit of tinyrl.rewards.limits, exceptions and bad values as errors naming the
function and the sample). The worker ignores SIGINT/SIGTERM (a Ctrl-C reaches the whole process
group: the trainer stops at a step boundary, and needs its rewards until then) and ends when
its pipe closes, which the OS does when the trainer dies.

A failure in this worker's own code (not the user's: those arrive as TinyRLErrors from _wrap and
resolve_user_fn) becomes an error reply with its traceback, and the worker lives on.

What the function prints (its stdout) never reaches the trainer's stdout, where the live
dashboard draws (a 100 kB print per call filled the user's log and would tear the screen): it
goes to RUN_DIR/reward_prints.log (`prints_to`; appended, so a resumed run adds to it), at most
MAX_PRINTS characters of Python output per worker, then one line saying the rest was dropped;
without a run directory (a test, a direct call) to stderr. That file is opened once the function
has loaded: what its module prints while it imports goes to stderr (shown before any model loads),
and a start that stops at the load (an import error, a function of the wrong shape) leaves no empty
file in the run directory, which tinyrl.rundir.claim then removes again (it held only its lock). Its stderr (warnings, tracebacks,
faulthandler's stack of a call stuck in C code) stays the trainer's stderr.

Cost: a process start and the module's import once, then ~0.1 ms of pipe and pickling per call.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any

from tinyrl.errors import TinyRLError
from tinyrl.printsink import BoundedText
from tinyrl.rewards import limits

BACKSTOP_S = 30.0  # past the worker's own limit (timeout + faulthandler's grace): it is hung
MAX_PRINTS = 10_000_000  # characters of a worker's Python prints kept in reward_prints.log


class WorkerReward:
    """`fn(completion, example[, episode=]) -> float` for a user's `file.py:func` / `module:func`
    spec. The episode crosses the pipe only when the user's function takes one (`wants_episode`,
    from the worker's load reply): it is pickled per call (the Episode's token lists)."""

    def __init__(self, spec: str, timeout_s: float, prints_to: Path | None = None):
        self.spec, self.timeout_s, self.prints_to = spec, timeout_s, prints_to
        self.wants_episode = False
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()  # one call at a time on the pipe (verl may call from threads)
        self._start()  # an import error is reported now, before any model loads

    def _start(self) -> None:
        ours, theirs = Pipe()
        # -c with this process's sys.path: the function imports as it would in-process
        # (a module:func found through a path the caller added, this checkout of tinyrl).
        code = (f"import sys; sys.path[:] = {sys.path!r}; from tinyrl.rewards.worker import serve; "
                f"serve({theirs.fileno()}, {str(self.prints_to) if self.prints_to else None!r})")
        self._proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),))
        theirs.close()
        self._conn = ours
        self._finalizer = weakref.finalize(self, _stop, self._proc, ours)
        self.wants_episode = self._ask(("load", self.spec, self.timeout_s), None)

    def __call__(self, completion: str, example: Any, episode: Any = None) -> float:
        with self._lock:
            if self._proc is None:  # the last worker died: a fresh one (eval and verl call on)
                self._start()
            sent = episode if self.wants_episode else None
            return self._ask(("call", completion, example, sent), (completion, example))

    def _ask(self, message: tuple, sample: tuple | None) -> Any:
        started = time.monotonic()
        try:
            self._conn.send(message)
            while not self._conn.poll(0.2):
                if self._proc.poll() is not None:
                    break
                if time.monotonic() - started > self.timeout_s + limits.GRACE_S + BACKSTOP_S:
                    self._proc.kill()  # hung past its own watchdog (e.g. stopped): not ours to wait for
                    break
            reply = self._conn.recv()
        except (EOFError, OSError):
            reply = None
        if reply is None:
            raise self._died(sample, time.monotonic() - started)
        if reply[0] == "error":
            _, message_, hint, cause = reply
            raise TinyRLError(message_, hint=hint) from _unpickled(cause)
        return reply[-1]  # ("ok", value), or ("ready", wants_episode) after a load

    def _died(self, sample: tuple | None, elapsed: float) -> TinyRLError:
        from tinyrl.rewards.registry import describe_sample

        self._proc.wait()
        code = self._proc.returncode
        self._finalizer()
        self._proc = None
        how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        on = f" on {describe_sample(*sample)}" if sample else " while importing it"
        if elapsed > self.timeout_s:  # faulthandler's watchdog: C code that never returned
            return TinyRLError(
                f"reward function {self.spec} did not return within reward.timeout_s = {self.timeout_s:g} s{on} "
                f"(stuck in C code: its worker process was ended, {how}; the stack is printed above)",
                hint=f"fix {self.spec} or raise reward.timeout_s")  # a run's stop adds how to continue it (cli)
        return TinyRLError(
            f"reward function {self.spec} ended its worker process without returning a reward ({how}){on}. "
            "A reward function must return a number: os._exit(), a crash in C code or a kill ends the "
            "process it runs in",
            hint=f"fix {self.spec} (call it on that row to reproduce; its errors, if any, are above"
                 f"{f', its prints in {self.prints_to}' if self.prints_to and sample else ''})")


def _internal_error(what: str, exc: Exception) -> tuple:
    traceback.print_exc()  # to the run's stderr: where it happened
    return ("error", f"{what}: {type(exc).__name__}: {exc}",
            "the traceback is above: if it ends in your reward's code, fix it there; otherwise it is a "
            "tinyrl bug, please report it with that traceback", _pickled(exc))


def _pickled(exc: BaseException | None) -> bytes | None:
    """The exception for the trainer's side, as the error's cause, when it pickles."""
    try:
        return pickle.dumps(exc) if exc is not None else None
    except Exception:  # noqa: BLE001 - an unpicklable exception: the message says it all
        return None


def _stop(proc: subprocess.Popen, conn: Connection) -> None:
    """Close the pipe (the worker's loop ends) and reap the process."""
    conn.close()
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _unpickled(blob: bytes | None) -> BaseException | None:
    """The function's own exception as the error's cause, when this process can rebuild it."""
    try:
        return pickle.loads(blob) if blob else None
    except Exception:  # noqa: BLE001 - a class only the user's module defines: no cause, same message
        return None


def _send_prints(prints_to: str | None) -> None:
    """The worker's stdout (fd 1: print, and C code or programs it starts) to `prints_to`, or to
    stderr when there is none (or it cannot be opened: said there)."""
    if isinstance(sys.stdout, BoundedText):  # from stderr to the file: what is buffered goes first
        sys.stdout.flush()
    target = 2
    if prints_to is not None:
        try:
            target = os.open(prints_to, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            print(f"tinyrl: cannot write the reward function's prints to {prints_to} ({exc.strerror}); "
                  "they go to stderr", file=sys.stderr)
    os.dup2(target, 1)
    if target != 2:
        os.close(target)
    if not isinstance(sys.stdout, BoundedText):  # one bound for the worker's life
        sys.stdout = BoundedText(lambda: open(1, "w", buffering=1, closefd=False), MAX_PRINTS, "the reward function")


def serve(fd: int, prints_to: str | None = None) -> None:
    """The worker's loop: ("load", spec, timeout_s), then ("call", completion, example, episode) ..."""
    from tinyrl.rewards.registry import _wrap, check_call_shape, reads_episode, resolve_user_fn

    _send_prints(None)  # until the function has loaded (the module docstring): then prints_to
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(fd)
    fn, spec = None, "the reward function"
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the trainer closed the pipe, or died
        except Exception as exc:  # noqa: BLE001 - a sample this process cannot rebuild: answer, live on
            reply = _internal_error(f"could not receive a sample for {spec}", exc)
        else:
            try:
                if message[0] == "load":
                    _, spec, timeout_s = message
                    user_fn = resolve_user_fn(spec)
                    check_call_shape(user_fn, spec)
                    fn = _wrap(user_fn, spec, timeout_s)
                    reply = ("ready", reads_episode(user_fn))
                    _send_prints(prints_to)
                else:
                    _, completion, example, episode = message
                    reply = ("ok", fn(completion, example, episode))
            except TinyRLError as exc:
                reply = ("error", exc.message, exc.hint, _pickled(exc.__cause__))
            # The user's own errors arrive above as TinyRLErrors (_wrap, resolve_user_fn). Anything
            # else is this worker's code failing: said as such, not as a dead worker, which reads
            # as the user's crash ("os._exit(), a crash in C code").
            except Exception as exc:  # noqa: BLE001
                loading = message[0] == "load"
                what = f"{'loading' if loading else 'calling'} {spec} failed in its worker process"
                reply = _internal_error(what, exc)
        try:
            conn.send(reply)
        except OSError:  # the trainer is gone (killed while this call ran): nobody to answer
            return
