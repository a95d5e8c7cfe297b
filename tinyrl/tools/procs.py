"""Find and kill the processes of one sandbox call by reading /proc.

Knows: Linux /proc (status: Uid, PPid; stat: pgrp, session, state). Does not know what a
sandbox call is: callers say which processes are theirs with a `match(info)` predicate.
Stdlib only, because the sandbox launcher imports it by file path before it drops privileges.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    uids: tuple[int, ...]   # real, effective, saved, filesystem
    threads: int
    zombie: bool


def _read(pid: int) -> ProcInfo | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read().decode(errors="replace")
    except OSError:                      # it exited between listdir and open
        return None
    # comm (field 2) may hold spaces and parentheses: split after the LAST ')'
    fields = stat[stat.rfind(")") + 2:].split()
    state, ppid, pgid, sid = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    uids: tuple[int, ...] = ()
    threads = 1
    for line in status.splitlines():
        if line.startswith("Uid:"):
            uids = tuple(int(x) for x in line.split()[1:])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return ProcInfo(pid, ppid, pgid, sid, uids, threads, state in ("Z", "X"))


def processes() -> list[ProcInfo]:
    """Every process visible now (threads are not listed: /proc holds thread-group leaders)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _read(int(name))
            if info is not None:
                out.append(info)
    return out


def descendants(root: int, procs: list[ProcInfo]) -> set[int]:
    """Pids below `root` in the parent tree of `procs` (root itself excluded)."""
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    found, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def reap_children() -> None:
    """Collect every exited child of this process (no-op when there are none)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def reap_until_gone(select, timeout_s: float = 2.0) -> list[int]:
    """Reap this process's exited children until `select(all processes, zombies included)` names
    none, or the timeout. A killed process is a zombie for a moment, and one that becomes a zombie
    after a single reap would outlive its subreaper (then pid 1 reaps it, whenever it gets to it,
    while it still counts against its uid's process limit). -> pids still there at the timeout."""
    deadline = time.monotonic() + timeout_s
    me = os.getpid()
    while True:
        reap_children()
        left = sorted(select([p for p in processes() if p.pid != me]))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.002)


def kill_selected(select, timeout_s: float = 10.0, reap: bool = False) -> tuple[set[int], list[int]]:
    """SIGKILL every live process that `select(live_processes) -> set of pids` names, until a
    scan finds none.

    A fork loop can create a process after a scan, so this repeats until a scan is empty (a
    process-count limit makes that converge). Zombies are dead already; with `reap`, this
    process collects those that are its own children. Returns (pids it sent SIGKILL, pids still
    alive at the timeout) -- the second is empty unless something resisted SIGKILL.
    """
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    me = os.getpid()
    while True:
        if reap:
            reap_children()
        live = [p for p in processes() if p.pid != me and not p.zombie]
        alive = sorted(select(live))
        if not alive:
            return killed, []
        if time.monotonic() > deadline:
            return killed, alive
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.002)
