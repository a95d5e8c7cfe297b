"""Is this CPU run sharing its cores with other work, and what to set then (issue 29 item 7).

Seen on this project's 2-core machine while other jobs ran: a countdown-tiny step took 22-32 s
with torch's default threads and 3.7-4 s with OMP_NUM_THREADS=1, with the same metrics. An
OpenMP team waits for its slowest thread at every parallel op, so a thread whose core another
process holds stalls the whole step (and spinning waiters take cores from the others).

tinyrl does not change its thread count for this: the thread rule is decode_thread_count's
(tinyrl.rollout.decode), chosen from the environment so that a run and its resume decode alike,
and OMP_WAIT_POLICY is read once when OpenMP starts, before any tinyrl code could set it. It
says what it sees and what to set, once per run (the trainer) and as a doctor row.

Signals, both cheap and read from numbers the caller passes in:
    load       the 1-minute load average (runnable threads, this run's own included) at least
               LOAD_MARGIN above the cores this process may use; or torch's threads above them
    slowdown   a step SLOWDOWN times the run's first step or more (the first holds the warm-up,
               so it is normally the slowest)
The load average is the machine's (in a container often the host's) and the cores are this
process's affinity: a CPU quota (cgroups) is not seen.

Knows: numbers. Does not know: torch, the trainer, how anything is printed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

LOAD_MARGIN = 1.0   # runnable threads beyond the cores, averaged over a minute
SLOWDOWN = 4.0      # a later step this many times the first step's seconds
MEASURED = ("measured on a loaded 2-core machine: one RL step of tinyrl's tiny model took 3.7-4 s with it, "
            "22-32 s without")


@dataclass(frozen=True)
class Contention:
    found: str   # what was seen, with its numbers
    fix: str     # what to set

    def notice(self) -> str:
        """The one line a run or eval logs."""
        return f"{self.found}. What to do: {self.fix}"


def cpu_contention(load: float, cpus: int, threads: int, step_seconds: Sequence[float] = (),
                   wait_policy: str = "", command: str = "train") -> Contention | None:
    """None when nothing says the cores are shared. `wait_policy`: OMP_WAIT_POLICY as set;
    `command`: the tinyrl command the fix's example starts (the one running: `tinyrl sft` was
    told `... tinyrl train ...`)."""
    reasons = []
    busy = load >= cpus + LOAD_MARGIN
    if busy:
        reasons.append(f"load average {load:.1f} on {cpus} usable cores")
    if threads > cpus:
        reasons.append(f"torch runs {threads} threads on {cpus} usable cores")
    slow = None
    if len(step_seconds) >= 2 and step_seconds[0] > 0:
        worst = max(step_seconds[1:])
        if worst >= SLOWDOWN * step_seconds[0]:
            slow = worst
            reasons.append(f"a step took {worst:.1f} s, {worst / step_seconds[0]:.0f}x the first step's "
                           f"{step_seconds[0]:.1f} s")
    if not reasons:
        return None
    found = "the CPU is oversubscribed: " + "; ".join(reasons)
    if threads <= 1:
        return Contention(found, "nothing to set in tinyrl (it already runs on one thread): other programs use "
                                 "the cores (see `top`), and steps are slower until they finish")
    count = 1 if busy or slow is not None else cpus  # only too many threads for the cores: one per core
    env = f"OMP_NUM_THREADS={count}" + ("" if wait_policy.upper() == "PASSIVE" else " OMP_WAIT_POLICY=PASSIVE")
    return Contention(found, f"start tinyrl with {env} in its environment (e.g. `{env} tinyrl {command} ...`; "
                             f"it is read when tinyrl starts); {MEASURED}")


def cpu_contention_now(threads: int, step_seconds: Sequence[float] = (), command: str = "train") -> Contention | None:
    """cpu_contention on this machine now: its load average, this process's usable cores and
    OMP_WAIT_POLICY as set, for a caller computing on `threads` torch threads (the trainer after a
    step, eval before its work). None where the OS has no load average."""
    load = load_average()
    if load is None:
        return None
    return cpu_contention(load, usable_cpus(), threads, step_seconds, os.environ.get("OMP_WAIT_POLICY", ""), command)


def usable_cpus() -> int:
    """The cores this process may run on (its affinity), else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load_average() -> float | None:
    """The 1-minute load average; None where the OS has none (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
