"""A time limit for one call of a user's reward function.

Python cannot kill a thread, and a watchdog *Python* thread cannot even run while the main
thread sits in C code holding the GIL, so neither bounds anything alone. Two mechanisms do:
  1. SIGALRM in the main thread (where the trainer calls rewards): setitimer fires after
     `seconds` and its handler raises RewardTimeout inside the function, at the next bytecode
     (blocking system calls are interrupted too: PEP 475 runs the handler). That ends a
     Python loop or a hung read cleanly, and the caller reports it as the function's error,
     naming the function and the sample.
  2. For code that never returns to the interpreter while holding the GIL (one C call such as
     `sum(range(10**13))`), faulthandler's watchdog, a C thread that needs no GIL: after
     `seconds` + a grace (2-5 s) it dumps every thread's stack (the user's file, line and
     function are on it) and ends the process (exit code 1). The last checkpoint on disk is
     whole (written atomically), so --resume works once the function is fixed.
A function that swallows RewardTimeout (a bare `except:`) and returns late is caught by the
elapsed-time check after the call. Off the main thread only 2 and that check apply.
A subprocess per call would bound time too, but costs a process and pickling per sample, and
many reward functions keep state (a loaded model, a cache) that would not survive it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import threading
import time
from typing import Callable, Iterator

GRACE_S = 5.0


class RewardTimeout(BaseException):
    """BaseException: a user's `except Exception:` must not swallow the time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[Callable[[], float]]:
    """Run the body for at most `seconds`; yields a function giving the elapsed time."""
    start = time.monotonic()
    main = threading.current_thread() is threading.main_thread()
    old_handler = None

    def on_alarm(signum, frame):
        raise RewardTimeout()

    grace = min(GRACE_S, max(2.0, seconds))  # C code that is merely slow gets a chance
    if main:
        old_handler = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + grace, exit=True)
    try:
        yield lambda: time.monotonic() - start
    finally:
        faulthandler.cancel_dump_traceback_later()
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
