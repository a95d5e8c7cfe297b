"""A time limit for one call of a user's reward function.

Python cannot kill a thread, so a limit that only watches from another thread bounds nothing.
Two mechanisms together really bound the time:
  1. SIGALRM in the main thread (where the trainer calls rewards): setitimer fires after
     `seconds` and its handler raises RewardTimeout inside the function, at the next bytecode.
     That ends any pure-Python loop cleanly and the caller reports it as the function's error.
  2. A watchdog thread for code that never returns to the interpreter (a C extension spinning,
     a catastrophic regex — the handler of 1 cannot run until the C call ends): after
     `seconds` + GRACE_S it prints which function and sample hung and ends the process with
     os._exit(2). The last checkpoint on disk is whole (written atomically), so --resume works.
A function that swallows RewardTimeout (a bare `except:`) and returns late is caught by the
elapsed-time check after the call. Off the main thread only 2 and that check apply.
A subprocess per call would bound time too, but costs a process and pickling per sample, and
many reward functions keep state (a loaded model, a cache) that would not survive it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Callable, Iterator

GRACE_S = 5.0


class RewardTimeout(BaseException):
    """BaseException: a user's `except Exception:` must not swallow the time limit."""


@contextlib.contextmanager
def time_limit(seconds: float, describe: Callable[[], str]) -> Iterator[Callable[[], float]]:
    """Run the body for at most `seconds`; yields a function giving the elapsed time."""
    start = time.monotonic()
    main = threading.current_thread() is threading.main_thread()
    old_handler = None

    def on_alarm(signum, frame):
        raise RewardTimeout()

    def hung():
        msg = (f"\ntinyrl: error: {describe()} has not returned after {seconds + GRACE_S:g} s and cannot be "
               "interrupted (it is inside code that does not return to Python). tinyrl stopped; the last "
               "checkpoint is intact.\nwhat to do: fix the function or raise reward.timeout_s, then "
               "--resume.\n")
        try:
            os.write(2, msg.encode())
        finally:
            os._exit(2)

    watchdog = threading.Timer(seconds + GRACE_S, hung)
    watchdog.daemon = True
    if main:
        old_handler = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    watchdog.start()
    try:
        yield lambda: time.monotonic() - start
    finally:
        watchdog.cancel()
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
