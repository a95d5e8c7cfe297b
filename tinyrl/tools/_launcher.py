"""The sandbox launcher: runs ONE snippet in a forked process with limits, kills what is left.

Started by tinyrl.tools.python as `python -I -u -B _launcher.py SPEC_JSON`, in a new session,
with a clean environment, stdout/stderr already pointing at the call's output files and the
call's work directory as cwd. Stdlib only (it must not import the trainer's packages).

What it does, in order:
  1. becomes a child subreaper (prctl), so a process that double-forks out of the child's
     process group is re-parented HERE, not to init, and is found and reaped below;
  2. unshares the network and pid namespaces where the OS allows (as root: CAP_SYS_ADMIN; as a
     user: unprivileged user namespaces); the code then sees only a down loopback, and (a
     mount namespace made by the code process) private size-capped temp directories;
  3. forks a reaper (init of the pid namespace; root stays root), which forks the code
     process: that sets the rlimits, drops to the call's own uid/gid (as root), asks for
     SIGKILL when its parent dies, and runs the code in this interpreter;
  4. waits for the reaper's report (the code's pid, then its wait status) until the wall-clock
     deadline; counts what the code left (the call's processes alive then, less the reaper and
     the code process; the reaper outlives the code for that, or its exit would kill them
     first); then SIGKILLs its process group, and every process of the sandbox uid (root) or
     every descendant (not root) until none is left, reaps them all, and writes the result
     JSON the trainer reads.
"""

import ctypes
import fcntl
import json
import linecache
import os
import resource
import select
import signal
import sys
import time
import traceback
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402  (the sibling module, by path: this runs as a script)

del sys.path[0]                      # the code's `import x` must not find the sandbox's modules

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWUSER = 0x20000, 0x40000000, 0x20000000, 0x10000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
# the world-writable places of a usual Linux: the code gets private, size-capped copies
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_libc = ctypes.CDLL(None, use_errno=True)


def _unshare(as_root: bool) -> tuple[str, bool]:
    """New network and pid namespaces for the next fork, the most the OS allows.

    Root needs CAP_SYS_ADMIN; a user needs unprivileged user namespaces (then the user's uid
    and gid are mapped to themselves inside, so files stay the user's). The network namespace
    holds only a down loopback: no connection anywhere, 127.0.0.1 included. In a pid namespace the code's
    `kill(-1)` / `kill(ppid)` reach nothing outside, and the kernel kills every process in it
    when its init (our reaper) ends. Returns (network status, pid namespace or not)."""
    user = 0 if as_root else CLONE_NEWUSER
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(user | CLONE_NEWNET | CLONE_NEWPID) == 0:
        network, pid_ns = "isolated", True
    elif _libc.unshare(user | CLONE_NEWNET) == 0:
        network, pid_ns = "isolated", False
    else:
        return f"not enforced (unshare: {os.strerror(ctypes.get_errno())})", False
    if not as_root:                  # map our uid to itself, so files made inside stay ours
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    return network, pid_ns


def _private_tmp(workdir: str, owner: tuple | None, size_mb: int) -> bool:
    """A new mount namespace where /tmp, /var/tmp, /dev/shm and /run/lock are one private
    tmpfs of `size_mb`: what the code writes there is capped, invisible to everyone else and
    gone with the call. The work directory is re-made at the same path inside it (the
    trainer's copy stays empty). False when the OS refuses (then those stay shared)."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        return False
    _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)   # nothing propagates back out
    opts = f"size={size_mb}m,mode=1777".encode()
    first = None
    for d in SHARED_TMP:
        if not os.path.isdir(d) or os.path.islink(d):
            continue
        if first is None:
            if _libc.mount(b"tmpfs", d.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
                return False
            first = d
        else:
            _libc.mount(first.encode(), d.encode(), None, MS_BIND, None)
    os.makedirs(workdir, mode=0o700)
    if owner is not None:
        os.chown(workdir, *owner)
    os.chdir(workdir)
    return True


def _fd_paths(paths: list, others_must_read: bool = True) -> list:
    """Import paths reachable after the privilege drop: the interpreter may live where the
    sandbox uid cannot traverse (/root/.pyenv under a 0700 /root). An O_PATH descriptor opened
    as root and reached through /proc/self/fd/N skips the ancestors' permission checks; the
    directories themselves are world-readable (others are dropped: the child could not read
    them anyway)."""
    moved = {}
    for p in paths:
        if p and os.path.isdir(p) and (not others_must_read or os.stat(p).st_mode & 0o005 == 0o005):
            moved[p] = f"/proc/self/fd/{os.open(p, os.O_PATH | os.O_DIRECTORY)}"
    # packages imported already (encodings, importlib, ...) find their submodules through
    # their own __path__: move those too, or `"x".encode("idna")` fails later
    for module in list(sys.modules.values()):
        pkg_path = getattr(module, "__path__", None)
        if not isinstance(pkg_path, list):
            continue
        for i, entry in enumerate(pkg_path):
            for old, new in moved.items():
                if entry.startswith(old + os.sep):
                    pkg_path[i] = new + entry[len(old):]
                    break
    return list(moved.values())


def _run_reaper(spec: dict, status_w: int) -> None:
    """In the forked child: fork the code process, report its pid and then its wait status on
    `status_w`, and reap every child until none is left (the code's leftovers stay alive
    meanwhile, to be counted). As root this stays root, so the code (another uid) cannot kill
    it; in a pid namespace it is the namespace's init, and its exit kills whatever the code
    left. Never returns."""
    os.setpgid(0, 0)                 # the call's process group: the wall-clock kill's target
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() not in (spec["launcher_pid"], 0):   # 0: the parent is outside our pid ns
        os._exit(137)                                   # the launcher died before the prctl
    code_pid = os.fork()
    if code_pid == 0:
        os.close(status_w)
        try:
            _confine(spec)
        except BaseException as e:  # noqa: BLE001  (the sandbox's own failure: say it, exit 125)
            print(f"sandbox setup failed: {type(e).__name__}: {e}", file=sys.stderr)
            os._exit(125)
        _run_code(spec["code"], spec.get("setup", ""))
    # the code's pid as this namespace numbers it: the launcher tells the code from what it left
    os.write(status_w, code_pid.to_bytes(4, "little"))
    while True:                      # reap: orphans of a pid namespace come to its init
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        if pid == code_pid:
            # then go on reaping instead of exiting: in a pid namespace our exit would kill what
            # the code left before the launcher has counted it (it kills us after counting)
            os.write(status_w, status.to_bytes(4, "little"))


def _confine(spec: dict) -> None:
    """In the code process, before the code: rlimits (inherited by all it starts), then the
    privilege drop when root, then death with the reaper and no_new_privs."""
    if spec["uid"] is not None or spec["isolate"]:
        # before the private /tmp below: a venv under /tmp (a CI clone) would vanish behind it
        sys.path[:] = _fd_paths(sys.path, others_must_read=spec["uid"] is not None)
    if spec["isolate"]:
        owner = (spec["uid"], spec["gid"]) if spec["uid"] is not None else None
        spec["private_tmp"] = _private_tmp(spec["workdir"], owner, spec["tmp_mb"])
    mb = 1024 * 1024
    limits = {
        resource.RLIMIT_CPU: spec["cpu_s"],
        resource.RLIMIT_AS: spec["memory_mb"] * mb,
        resource.RLIMIT_FSIZE: spec["file_size_bytes"],
        resource.RLIMIT_NOFILE: spec["max_files"],
        resource.RLIMIT_NPROC: spec["max_procs"] + spec["nproc_base"],
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    if spec["uid"] is not None:
        os.setgroups([])
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])       # real, effective and saved: no way back to root
        _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)   # so /proc/self/fd stays ours after setuid
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # a setuid binary (passwd, mount, chsh) or file capability then runs without its privileges:
    # the code cannot climb back to root through one; inherited by all it starts, cannot be unset
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")


def _run_code(code: str, setup: str = "") -> None:
    """Run the snippet as `python main.py` would, after the task's `setup` (a file of its own,
    "<setup>", in the same __main__: the snippet sees what it defines and its tracebacks count
    its own lines); exit with its status. Never returns."""
    linecache.cache["<code>"] = (len(code), None, code.splitlines(True), "<code>")
    linecache.cache["<setup>"] = (len(setup), None, setup.splitlines(True), "<setup>")
    main = types.ModuleType("__main__")      # the code's own __main__, not the launcher's
    sys.modules["__main__"] = main
    sys.modules.pop("procs", None)           # nor the launcher's helper module
    status = 0
    try:
        if setup:
            exec(compile(setup, "<setup>", "exec"), main.__dict__)
        exec(compile(code, "<code>", "exec"), main.__dict__)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException as e:  # the code's own error: its traceback, as `python main.py` shows it
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        traceback.print_exception(type(e), e, tb)
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001  (a closed or full stream: nothing more to say)
        pass
    os._exit(status & 0xFF)


def _wait(status_r: int, deadline: float) -> bytes:
    """Read the reaper's report (4 bytes: the code's pid; 4 more: its wait status) until it is
    whole, the reaper is gone (end of file) or `deadline`; reap re-parented orphans meanwhile.
    SIGCHLD and SIGIO (the pipe: data or end of file, see main) wake it. -> the bytes read."""
    got = b""
    while len(got) < 8:
        procs.reap_children()
        if select.select([status_r], [], [], 0)[0]:
            chunk = os.read(status_r, 8 - len(got))
            if not chunk:
                return got
            got += chunk
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            return got
        signal.sigtimedwait([signal.SIGCHLD, signal.SIGIO], min(left, 0.5))
    return got


def _ns_pid(pid: int) -> int | None:
    """`pid`'s number in its own (innermost) pid namespace: the last of /proc's NSpid."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except OSError:
        pass
    return None


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    start = time.monotonic()
    os.nice(spec["nice"])            # launcher, reaper and code: the trainer wins the CPU
    as_root = spec["uid"] is not None
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # RLIMIT_NPROC counts every thread of the real uid: a user's own processes count too (the
    # reaper included; counted before a user namespace would show every uid as 65534)
    me = os.getuid()
    spec["nproc_base"] = 0 if as_root else 1 + sum(p.threads for p in procs.processes() if p.uids[:1] == (me,))
    network, pid_ns = _unshare(as_root) if spec["isolate"] else ("not requested", False)
    spec["launcher_pid"] = me_pid = os.getpid()
    status_r, status_w = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD, signal.SIGIO])
    fcntl.fcntl(status_r, fcntl.F_SETOWN, me_pid)    # SIGIO to us when the reaper writes or ends
    fcntl.fcntl(status_r, fcntl.F_SETFL, fcntl.fcntl(status_r, fcntl.F_GETFL) | os.O_ASYNC)
    reaper = os.fork()
    if reaper == 0:
        try:
            os.close(status_r)
            _run_reaper(spec, status_w)
        finally:
            os._exit(125)            # only reached when the reaper's own setup raised
    os.close(status_w)
    report = _wait(status_r, start + spec["timeout_s"])
    timed_out = len(report) < 8 and time.monotonic() >= start + spec["timeout_s"]
    if as_root:
        uid = spec["uid"]
        ours = lambda ps: {p.pid for p in ps if uid in p.uids}  # noqa: E731
    else:
        ours = lambda ps: {p.pid for p in ps if p.pgid == reaper} | procs.descendants(me_pid, ps)  # noqa: E731
    # What the code left: the call's live processes now (the code has ended, or the clock ran
    # out), less the reaper and the code process itself; a fork loop's later children are
    # added as the cleanup kills them. Counted before any kill, so nothing dies uncounted.
    not_left = {reaper}
    if len(report) == 4:             # the code still runs (the clock ran out): it is no leftover
        code_ns_pid = int.from_bytes(report, "little")
        not_left |= {p.pid for p in procs.processes() if p.ppid == reaper and _ns_pid(p.pid) == code_ns_pid}
    left = ours([p for p in procs.processes() if not p.zombie]) - not_left
    try:
        os.killpg(reaper, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    killed, alive = procs.kill_selected(ours, reap=True)
    procs.reap_until_gone(ours)      # zombies included: none may outlive this subreaper
    left |= killed - not_left
    raw = report[4:]
    result = {
        "status": int.from_bytes(raw, "little") if len(raw) == 4 else None,
        "timed_out": timed_out,
        "seconds": time.monotonic() - start,
        "network": network,
        "pid_namespace": pid_ns,
        "leftover_killed": len(left),
        "survivors": alive,
    }
    with open(spec["result_path"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
