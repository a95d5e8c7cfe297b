"""The Python tool: run untrusted code in a fresh, limited subprocess and say what happened.

`run_code(code)` -> `ToolResult`; `run_many(codes)` runs a batch in a bounded thread pool, in
order. Each call gets a fresh temporary directory (removed afterwards; one whose creator was
SIGKILLed is removed by the next call, `sweep_stale_dirs`) and a fresh launcher
process (`_launcher.py`: limits, privilege drop, network namespace, wall-clock kill, cleanup).
When the trainer runs as root, each concurrent call runs under its own unprivileged uid
(UID_BASE + a slot held with flock, so two calls -- even of two trainers -- never share one);
that uid is what makes "kill every process the call left" exact. See README, "The Python
sandbox: what it enforces". Knows nothing of tasks, turns or tokens.
"""

from __future__ import annotations

import fcntl
import grp
import json
import math
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tinyrl.errors import TinyRLError
from tinyrl.tools import procs

UID_BASE = 60000          # sandbox uids UID_BASE .. UID_BASE + UID_SLOTS - 1 (need not exist)
UID_SLOTS = 64
# Fixed, not under tempfile.gettempdir(): two root trainers with different TMPDIRs must see each
# other's locks, or both take one uid and each kills the other's processes as its call starts.
UID_LOCK_DIR = Path("/tmp/tinyrl-sandbox-uids")
_LAUNCHER = Path(__file__).with_name("_launcher.py")
_BACKSTOP_S = 30.0        # the launcher's own cleanup is given this long past the deadline
_SIGNAL_WHY = {
    "SIGKILL": "killed",
    "SIGXCPU": "CPU time limit exceeded",
    "SIGXFSZ": "file size limit exceeded",
    "SIGSEGV": "segmentation fault",
}


@dataclass(frozen=True)
class ToolResult:
    """What a tool call gave: the sandbox's full account of a run, or a tool of your own's
    `ToolResult(stdout=..., stderr=..., exit_code=...)`: the fields after exit_code are the
    sandbox's and default to a call that simply finished (README, "Your own tools")."""

    stdout: str
    stderr: str
    exit_code: int            # the process's exit status; -N when signal N ended it
    timed_out: bool = False   # the wall clock ran out and the call was killed
    killed_by: str | None = None  # signal name when a signal ended it (SIGKILL after a timeout)
    truncated: bool = False   # stdout or stderr was cut to `max_output_bytes`
    seconds: float = 0.0      # wall clock of the call, launcher start to cleanup done
    message: str = ""         # one line for the model's tool turn: what happened (default "exit code N")
    network: str = ""         # "isolated", or why not ("" : not the sandbox's run)
    pid_namespace: bool = False   # the code ran in its own pid namespace
    # processes the code left behind that the cleanup killed: the call's processes alive when the
    # code ended or the clock ran out, the code's own process not counted (README)
    leftover_killed: int = 0

    def __post_init__(self):
        if not self.message:  # a tool of one's own that gave none: its tool turn still says what happened
            object.__setattr__(self, "message", f"exit code {self.exit_code}")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def status(self) -> str:
        """The call's status (tinyrl.rollout.base.TOOL_CALL_STATUSES): "ok", "error" or "timeout"."""
        return "timeout" if self.timed_out else "ok" if self.exit_code == 0 else "error"


# rollout.tool_memory_mb's floor too (tinyrl.config). Not the interpreter's ~14 MiB of address space:
# below what `import numpy` maps (numpy 2.3, OpenBLAS) it hangs in its extension's load until the call
# times out, so a floor under that let a user's limit pass as a tool timeout blamed on the model's code.
# That need is the machine's: 97-112 MiB where this floor became 128 (2026-11-28; 96 hung, 112
# worked), 131 MiB on an AMD EPYC (2026-11-29: two 32 MiB OpenBLAS buffers, 19 MiB of its library,
# Python 3.11), where 128 hung. Twice that: another CPU, Python or numpy may map more.
MIN_MEMORY_MB = 256


def _check(timeout_s: float, memory_mb: int, max_output_bytes: int, max_processes: int) -> None:
    problems = []
    if not timeout_s > 0:
        problems.append(f"timeout_s must be > 0, got {timeout_s}")
    if memory_mb < MIN_MEMORY_MB:
        problems.append(f"memory_mb must be >= {MIN_MEMORY_MB} (below it `import numpy` can hang to the "
                        f"timeout), got {memory_mb}")
    if max_output_bytes < 64:
        problems.append(f"max_output_bytes must be >= 64, got {max_output_bytes}")
    if max_processes < 1:
        problems.append(f"max_processes must be >= 1, got {max_processes}")
    if problems:
        raise TinyRLError("bad sandbox limits: " + "; ".join(problems),
                          hint="use run_code's defaults (timeout_s=10, memory_mb=1024) or fix these")


def uid_lock_path(uid: int) -> Path:
    """The file a call holds (flock) while it runs under `uid`: a free lock means no call."""
    UID_LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(UID_LOCK_DIR)
    # /tmp is everyone's: a directory another user made there could hold every uid's lock (no
    # call would ever start) or point a lock file at a file of root's
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise TinyRLError(f"{UID_LOCK_DIR} (the sandbox's uid locks) is not a directory that only this user "
                          f"(uid {os.geteuid()}) can write, so the sandbox cannot trust its locks",
                          hint=f"stop any tinyrl run on this machine, then remove it: rm -rf {UID_LOCK_DIR}")
    return UID_LOCK_DIR / f"{uid}.lock"


def lock_uid(uid: int) -> int | None:
    """The fd of `uid`'s lock file, held exclusively (flock, released when the fd closes); None
    when another process holds it."""
    fd = os.open(uid_lock_path(uid), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class _UidSlot:
    """An unprivileged uid/gid held exclusively (flock) for one call; root only."""

    def __init__(self) -> None:
        while True:
            for slot in range(UID_SLOTS):
                uid = UID_BASE + slot
                if _exists(pwd.getpwuid, uid) or _exists(grp.getgrgid, uid):
                    continue          # a real account: never run code as it
                fd = lock_uid(uid)
                if fd is None:
                    continue
                self.uid = self.gid = uid
                self._fd = fd
                # a trainer killed mid-call may have left processes under this uid
                procs.kill_selected(self.owned)
                return
            time.sleep(0.05)          # every slot busy: wait for one

    def owned(self, live) -> set[int]:
        return {p.pid for p in live if self.uid in p.uids}

    def release(self) -> None:
        os.close(self._fd)


def _exists(lookup, ident: int) -> bool:
    try:
        lookup(ident)
        return True
    except KeyError:
        return False


def _clean_env(home: str) -> dict[str, str]:
    """All the code sees: nothing of the trainer's environment (tokens, CUDA, paths)."""
    one = "1"
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home,
            "TMPDIR": home, "OMP_NUM_THREADS": one, "OPENBLAS_NUM_THREADS": one,
            "MKL_NUM_THREADS": one}


def _read_output(path: Path, limit: int) -> tuple[str, bool]:
    """At most `limit` bytes of a stream: its head and tail when longer (a traceback's last
    line is the one that matters). Bounded reads: a 16 MB file is never loaded whole."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= limit:
            return f.read().decode(errors="replace"), False
        head = f.read(limit // 2)
        f.seek(size - (limit - limit // 2))
        tail = f.read()
    cut = f"\n[... {size - len(head) - len(tail)} bytes cut ...]\n"
    return head.decode(errors="replace") + cut + tail.decode(errors="replace"), True


def _rmtree(path: str) -> None:
    """Remove a call's directory, whatever its code did to the modes of its own files."""
    root = os.path.abspath(path)

    def unlock(func, p, exc_info):  # the code may have chmod 000'ed its own files (non-root)
        if issubclass(exc_info[0], FileNotFoundError):
            return                  # gone already: another process's sweep removed it first
        parent = os.path.dirname(os.path.abspath(p))
        # never what holds the tree: the directory itself failing made this chmod the temp dir
        # (/tmp) 0700, and every other user of the machine lost /tmp
        if parent != root and not parent.startswith(root + os.sep):
            raise exc_info[1]
        os.chmod(parent, 0o700)
        os.chmod(p, 0o700) if os.path.isdir(p) else None
        func(p)
    shutil.rmtree(path, onerror=unlock)


# A call's directory: tinyrl-sandbox-PID-START-PIDNS-BOOT-xxxxxxxx, its creating process named
# in it (START: its start time in clock ticks since boot, so a reused pid is not taken for it;
# PIDNS: the inode of its pid namespace, where PID means something; BOOT: the kernel's boot id,
# cut to 8 hex digits). In the name, not in a file: the directory never exists without it.
_DIR_PREFIX = "tinyrl-sandbox-"
_DIR_NAME = re.compile(re.escape(_DIR_PREFIX) + r"(\d+)-(\d+)-(\d+)-([0-9a-f]{8})-[a-z0-9_]+")
_creator_tags: dict[int, str] = {}


def _start_ticks(pid) -> tuple[int, bool] | None:
    """(start time in clock ticks since boot, ended (a zombie)) of `pid`, None when no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()     # field 3 (state) on; starttime is field 22
    return int(fields[19]), fields[0] in ("Z", "X")


def _pid_ns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:                  # no namespace files: one namespace, as far as we can tell
        return 0


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip().replace("-", "")[:8]
    except OSError:                  # unknown: every directory counts as this boot's
        return "0" * 8


def _dir_prefix() -> str:
    """This process's directory prefix (per pid: a forked child is a creator of its own)."""
    pid = os.getpid()
    if pid not in _creator_tags:
        _creator_tags[pid] = f"{_DIR_PREFIX}{pid}-{_start_ticks('self')[0]}-{_pid_ns()}-{_boot_id()}-"
    return _creator_tags[pid]


def sweep_stale_dirs(tmp: str | None = None) -> list[str]:
    """Remove the call directories in `tmp` (the temp dir) whose creating process is gone: a
    trainer SIGKILLed mid-call cannot remove its own. Kept: those of a live process (its pid
    and start time match; a tinyrl run beside this one), of another pid namespace (whose pids
    this process cannot check), of another user, and anything named otherwise. Never raises.
    -> the paths removed. Called by every `run_code` before it makes its own directory."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        my_ns, boot, me = _pid_ns(), _boot_id(), os.geteuid()
        entries = list(os.scandir(tmp))
    except OSError:
        return removed
    for entry in entries:
        m = _DIR_NAME.fullmatch(entry.name)
        if m is None:
            continue
        pid, start, ns, dir_boot = int(m[1]), int(m[2]), int(m[3]), m[4]
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != me:
                continue
            if dir_boot == boot:         # another boot's directory is stale whatever its pid
                if ns != my_ns:
                    continue
                now = _start_ticks(pid)
                if now is not None and now == (start, False):
                    continue             # its creator lives: its call may be running
            _rmtree(entry.path)          # the work dir may be the sandbox uid's: root removes it
            removed.append(entry.path)
        except OSError:                  # removed meanwhile by another sweep, or not ours to remove
            pass
    return removed


def _describe(exit_code: int, killed_by: str | None, timed_out: bool, truncated: bool,
              timeout_s: float, stderr: str) -> str:
    if timed_out:
        parts = [f"timed out after {timeout_s:g} s (wall clock); the process and its children were killed"]
    elif killed_by:
        parts = [f"killed by {killed_by} ({_SIGNAL_WHY.get(killed_by, 'signal')})"]
    elif exit_code == 0:
        parts = ["exit code 0"]
    else:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        parts = [f"exit code {exit_code}" + (f": {last}" if last else "")]
    if truncated:
        parts.append("output truncated")
    return "; ".join(parts)


def run_code(code: str, timeout_s: float = 10.0, memory_mb: int = 1024, *,
             max_output_bytes: int = 16384, max_processes: int = 16, max_open_files: int = 64,
             file_size_mb: int = 16, isolate: bool = True, setup: str = "") -> ToolResult:
    """Run `code` as a fresh `python` program; never raises for anything the code does.
    `setup`: code run first in the same interpreter, under the same limits (a task's data for the
    model's code: what it defines, the code sees; its own output comes first).

    Limits: wall clock `timeout_s` (then SIGKILL of the whole process group and of every
    process the call left), CPU time ceil(timeout_s) + 1 s per process, address space
    `memory_mb` per process, files written <= `file_size_mb` (stdout/stderr included), open
    files, processes (`max_processes`, per call as root; on top of the user's own otherwise).
    `isolate`: new network, pid and mount namespaces where the OS allows (no network, nothing
    outside reachable by kill, private size-capped /tmp); `result.network` says what held.
    """
    if not isinstance(code, str) or not isinstance(setup, str):  # None ran as "exit code 125", unexplained
        raise TinyRLError(f"run_code takes Python source as a str: code is a {type(code).__name__}, setup a "
                          f"{type(setup).__name__}", hint="pass the program's text, e.g. run_code(\"print(6 * 7)\")")
    _check(timeout_s, memory_mb, max_output_bytes, max_processes)
    start = time.monotonic()
    as_root = os.geteuid() == 0
    slot = _UidSlot() if as_root else None
    sweep_stale_dirs()
    base = tempfile.mkdtemp(prefix=_dir_prefix())
    try:
        return _run(code, timeout_s, memory_mb, max_output_bytes, max_processes, max_open_files,
                    file_size_mb, isolate, slot, Path(base), start, setup)
    except OSError as e:             # the sandbox's own machinery, not the code: say so, go on
        return ToolResult("", "", -1, False, None, False, time.monotonic() - start,
                          f"sandbox failed to run the code: {e}", "unknown", False)
    finally:
        _rmtree(base)
        if slot is not None:
            slot.release()


def _run(code, timeout_s, memory_mb, max_output_bytes, max_processes, max_open_files,
         file_size_mb, isolate, slot, base: Path, start, setup: str = "") -> ToolResult:
    os.chmod(base, 0o711)             # the sandbox uid may pass through, not list
    work = base / "work"
    work.mkdir(mode=0o700)
    if slot is not None:
        os.chown(work, slot.uid, slot.gid)
    spec = {
        "code": code, "setup": setup, "timeout_s": timeout_s, "memory_mb": memory_mb,
        "file_size_bytes": file_size_mb * 1024 * 1024,
        "cpu_s": math.ceil(timeout_s) + 1,   # a backstop: the wall clock comes first
        "max_files": max_open_files, "max_procs": max_processes, "nice": 10,
        "uid": slot.uid if slot else None, "gid": slot.gid if slot else None,
        "isolate": isolate, "result_path": str(base / "result.json"),
        "workdir": str(work), "tmp_mb": 4 * file_size_mb,
    }
    (base / "spec.json").write_text(json.dumps(spec))
    with open(base / "stdout", "wb") as out, open(base / "stderr", "wb") as err:
        # -I on purpose, unlike the math-verify worker (tinyrl/tasks/verify.py, -P): the code
        # gets the interpreter's own packages and nothing of the trainer's environment, not its
        # PYTHONPATH or user site either (the env below is clean anyway; as root, directories
        # put on the code's path become readable to the sandbox uid through _fd_paths' handles,
        # e.g. a checkout below a 0700 /root)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-u", "-B", str(_LAUNCHER), str(base / "spec.json")],
            stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=work,
            env=_clean_env(str(work)), start_new_session=True, close_fds=True)
    backstop = False
    try:
        proc.wait(timeout=timeout_s + _BACKSTOP_S)
    except subprocess.TimeoutExpired:   # the launcher itself is stuck: kill all of it from here
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        backstop = True
    # whatever the launcher did, nothing of this call survives it
    if slot is not None:
        procs.kill_selected(slot.owned)
    else:
        procs.kill_selected(lambda live: {p.pid for p in live if p.sid == proc.pid})
    stdout, cut_out = _read_output(base / "stdout", max_output_bytes)
    stderr, cut_err = _read_output(base / "stderr", max_output_bytes)
    result_path = base / "result.json"
    info = json.loads(result_path.read_text()) if result_path.exists() else None
    if info is None:                    # the launcher died before writing its result
        timed_out, status, network, pid_ns, leftovers = backstop, None, "unknown", False, 0
    else:
        timed_out, status = info["timed_out"], info["status"]
        network, pid_ns, leftovers = info["network"], info["pid_namespace"], info["leftover_killed"]
    if status is not None and os.WIFSIGNALED(status):
        exit_code = -os.WTERMSIG(status)
    elif status is not None:
        exit_code = os.WEXITSTATUS(status)
    else:
        exit_code = -signal.SIGKILL
    killed_by = signal.Signals(-exit_code).name if exit_code < 0 else None
    truncated = cut_out or cut_err
    message = _describe(exit_code, killed_by, timed_out, truncated, timeout_s, stderr)
    if info is None and not backstop:   # not the code's doing: say whose it was
        message = f"the sandbox launcher ended without a result (exit status {proc.returncode}); the code was killed"
    return ToolResult(
        stdout=stdout, stderr=stderr, exit_code=exit_code, timed_out=timed_out,
        killed_by=killed_by, truncated=truncated, seconds=time.monotonic() - start,
        message=message,
        network=network, pid_namespace=pid_ns, leftover_killed=leftovers)


def run_many(codes: list[str], max_workers: int | None = None, **limits) -> list[ToolResult]:
    """Run a batch of snippets, at most `max_workers` at once (default: the CPU count, at
    most 8); results in the order of `codes`. `limits` are run_code's keyword arguments."""
    if not codes:
        return []
    workers = max_workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tinyrl-sandbox") as pool:
        return list(pool.map(lambda c: run_code(c, **limits), codes))
