"""The Python sandbox (tinyrl.tools.python): what a snippet sees, and that hostile snippets end
as a ToolResult within their limit, leave no process behind and do not touch the caller.

Tests run as root here and in CI (the strong mode: a uid per call); one test drives the
non-root mode through an unprivileged process. Bounds on seconds are loose on purpose (a busy
2-core machine): they catch a kill that never came, not a slow one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import tinyrl.tools.python as sandbox
from tinyrl.errors import TinyRLError
from tinyrl.tools import TOOLS, ToolResult, render
from tinyrl.tools import procs
from tinyrl.tools.python import (MIN_MEMORY_MB, UID_BASE, UID_SLOTS, _dir_prefix, _read_output, lock_uid, run_code,
                                 run_many, sweep_stale_dirs)

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parent.parent
HOSTILE_TIMEOUT_S = 3.0
# measured here: a plain call 0.35-0.6 s, a 3 s timeout 3.4-3.6 s (quiet); +20 s for a busy box
SLACK_S = 20.0


def _left_under(uid: int, wait_s: float = 5.0) -> list[str]:
    """The processes of `uid`, zombies included (they would count against the next call's
    process limit), after up to `wait_s` for them to go: a killed process is a zombie until
    its parent (init, once the launcher is gone) reaps it; one the cleanup missed stays."""
    deadline = time.monotonic() + wait_s
    while True:
        left = [p.pid for p in procs.processes() if uid in p.uids]
        if not left or time.monotonic() > deadline:
            return [_cmdline(pid) for pid in left]
        time.sleep(0.02)


@pytest.fixture(autouse=True)
def no_process_left_behind(monkeypatch):
    """After every call of the test, while the call still holds its uid (as root): no process
    of that uid. Checked at the release, not after the test for every sandbox uid: once released,
    the uid may be another call's (another xdist worker's, or another user's tinyrl on this
    machine: "assert {12138, 12139} == set()" was such a call). After the test: no live
    descendant of this test process, less those it had before (another test's long-lived
    math-verify worker, multiprocessing's resource tracker: a clean-clone CI run failed every
    test here on them)."""
    before = procs.descendants(os.getpid(), [p for p in procs.processes() if not p.zombie])
    at_release: list[str] = []
    release = sandbox._UidSlot.release

    def checked_release(slot):
        at_release.extend(_left_under(slot.uid))
        release(slot)
    monkeypatch.setattr(sandbox._UidSlot, "release", checked_release)
    yield
    left = procs.descendants(os.getpid(), [p for p in procs.processes() if not p.zombie]) - set(before)
    assert left == set(), [_cmdline(pid) for pid in left]
    assert at_release == []


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f"{pid}: " + f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid}: gone"


# ---- ordinary snippets ------------------------------------------------------------------

def test_stdout_and_exit_code():
    r = run_code("print('hello', 6 * 7)\nimport sys; print('warn', file=sys.stderr)")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.killed_by, r.truncated) == \
        ("hello 42\n", "warn\n", 0, False, None, False)
    assert r.ok and r.message == "exit code 0"


def test_exception_gives_its_traceback_and_exit_code_1():
    r = run_code("x = 1\ndef f():\n    return x / 0\nf()")
    assert r.exit_code == 1 and not r.timed_out and r.stdout == ""
    assert r.stderr.startswith("Traceback (most recent call last):")
    assert 'File "<code>", line 3, in f' in r.stderr and "return x / 0" in r.stderr
    assert "_launcher" not in r.stderr           # the sandbox's own frames are not shown
    assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert r.message == "exit code 1: ZeroDivisionError: division by zero"


def test_setup_runs_first_in_the_same_interpreter_and_keeps_its_own_lines():
    """A task's per-episode setup (verl's create_kwargs: tinyrl.tools): the code sees what it
    defines, the code's traceback counts the code's lines, the setup's own error names it."""
    r = run_code("print(a * b)\nprint(c)", setup="a = 6\nb = 7\nprint('loaded')")
    assert r.stdout == "loaded\n42\n" and r.exit_code == 1
    assert 'File "<code>", line 2, in <module>' in r.stderr and "print(c)" in r.stderr
    assert "<setup>" not in r.stderr and r.message == "exit code 1: NameError: name 'c' is not defined"
    bad = run_code("print(1)", setup="x = 1\n1 / 0")
    assert bad.stdout == "" and 'File "<setup>", line 2' in bad.stderr and "1 / 0" in bad.stderr
    assert run_code("print(a)").message == "exit code 1: NameError: name 'a' is not defined"  # none: none
    assert run_code("while True: pass", timeout_s=HOSTILE_TIMEOUT_S, setup="a = 1").timed_out  # same limits


def test_syntax_error():
    r = run_code("print('never')\ndef f(:\n")
    assert r.exit_code == 1 and r.stdout == ""
    assert 'File "<code>", line 2' in r.stderr and "SyntaxError" in r.stderr


def test_sys_exit_code_and_a_silent_program():
    assert run_code("import sys; sys.exit(3)").exit_code == 3
    assert render(run_code("x = 1")) == "[no output; exit code 0]"


def test_timeout_kills_and_says_so():
    r = run_code("print('started', flush=True)\nwhile True: pass", timeout_s=1.5)
    assert r.timed_out and r.killed_by == "SIGKILL" and r.exit_code == -9
    assert r.stdout == "started\n"               # output before the kill is kept
    assert r.message.startswith("timed out after 1.5 s")
    assert 1.5 <= r.seconds < 1.5 + SLACK_S


def test_fresh_directory_each_call_removed_afterwards():
    code = "import os; open('f', 'w').write('x'); print(os.getcwd()); print(sorted(os.listdir('.')))"
    a, b = run_code(code), run_code(code)
    cwd_a, cwd_b = a.stdout.splitlines()[0], b.stdout.splitlines()[0]
    assert cwd_a != cwd_b and a.stdout.splitlines()[1] == "['f']" == b.stdout.splitlines()[1]
    assert not os.path.exists(cwd_a) and not os.path.exists(cwd_b)


def test_third_party_packages_importable():
    """The code runs on the trainer's interpreter, so what the venv has (numpy) is importable
    -- also as root under an unprivileged uid, where the interpreter may sit below a 0700 /root."""
    r = run_code("import numpy as np; print(int(np.arange(5).sum()))")
    assert (r.stdout, r.exit_code) == ("10\n", 0), r.stderr
    # a submodule of a package the interpreter imported at startup (encodings)
    r = run_code("print('bücher.de'.encode('idna'))")
    assert r.stdout == "b'xn--bcher-kva.de'\n", r.stderr


def test_numpy_imports_at_the_smallest_memory_limit_allowed():
    """At the old floor (64 MiB) `import numpy` hung in its extension's load until the timeout, so
    a user's rollout.tool_memory_mb passed validation and then showed as the model's tool timeouts;
    at the next (128 MiB) it hung on an AMD EPYC, where it maps 131 MiB."""
    r = run_code("import numpy as np; print(int(np.arange(5).sum()))", timeout_s=20, memory_mb=MIN_MEMORY_MB)
    assert (r.status, r.stdout) == ("ok", "10\n"), (r.status, r.stderr[-500:])


def test_the_code_is_its_own_main_module():
    """As `python main.py`: `__main__` is the code (pickle and multiprocessing need that), and
    nothing of the launcher is importable."""
    code = textwrap.dedent("""
        import __main__, importlib.util
        from multiprocessing import Pool
        def square(x):
            return x * x
        print(__main__.square is square, importlib.util.find_spec('procs'))
        with Pool(2) as pool:
            print(pool.map(square, range(4)))
    """)
    r = run_code(code)
    assert r.stdout == "True None\n[0, 1, 4, 9]\n", r.stderr


def test_bad_limits_raise_every_problem_at_once():
    with pytest.raises(TinyRLError) as e:
        run_code("print(1)", timeout_s=0, memory_mb=8)
    assert "timeout_s" in e.value.message and "memory_mb" in e.value.message and e.value.hint


@pytest.mark.parametrize("code, setup, said", [(None, "", "code is a NoneType"), (b"print(1)", "", "code is a bytes"),
                                               ("print(a)", None, "setup a NoneType")])
def test_code_that_is_not_a_str_is_refused_with_a_reason(code, setup, said):
    """run_code(None) ran, and came back as an unexplained "exit code 125"."""
    with pytest.raises(TinyRLError, match=said) as e:
        run_code(code, setup=setup)
    assert "as a str" in e.value.message and e.value.hint


# ---- hostile snippets -------------------------------------------------------------------

FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""

LEAVE_CHILDREN = """
import os, subprocess, time
subprocess.Popen(['sleep', '1000'])
if os.fork() == 0:              # the classic daemon: fork, setsid, fork again, parent exits
    os.setsid()
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
time.sleep(0.2)
print('left them running')
"""


def test_infinite_loop():
    r = run_code("while True: pass", timeout_s=HOSTILE_TIMEOUT_S)
    assert r.timed_out and r.seconds < HOSTILE_TIMEOUT_S + SLACK_S


def test_fork_bomb_is_capped_and_cleaned_up():
    r = run_code(FORK_BOMB, timeout_s=HOSTILE_TIMEOUT_S, max_processes=16)
    assert r.timed_out and r.seconds < HOSTILE_TIMEOUT_S + SLACK_S
    # the process limit held: the cleanup never found more than the limit alive
    assert r.leftover_killed <= 16


def test_print_flood_is_truncated_and_bounded():
    r = run_code("while True: print('x' * 1000)", timeout_s=HOSTILE_TIMEOUT_S,
                 max_output_bytes=4096, file_size_mb=1)
    # the file-size limit ends it (EFBIG) long before the wall clock
    assert not r.timed_out and r.exit_code == 1 and "File too large" in r.stderr
    assert r.truncated and "output truncated" in r.message
    assert len(r.stdout) < 4096 + 100 and "bytes cut" in r.stdout


def test_ten_gb_allocation_is_a_memory_error():
    r = run_code("b = bytearray(10**10)", memory_mb=512)
    assert r.exit_code == 1 and r.stderr.rstrip().endswith("MemoryError")


def test_cannot_write_outside_its_directory(tmp_path):
    targets = [tmp_path / "escaped", REPO / ".sandbox-escape-probe", Path("/etc/tinyrl-sandbox-probe")]
    code = textwrap.dedent(f"""
        for p in {[str(t) for t in targets]!r}:
            try:
                open(p, 'w').write('pwned')
                print('wrote', p)
            except OSError as e:
                print('denied', type(e).__name__)
    """)
    r = run_code(code)
    # tmp_path sits below /tmp, hidden by the private /tmp (FileNotFoundError); the rest: EACCES
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["denied"] * 3, r.stdout + r.stderr
    assert not any(t.exists() for t in targets)


def test_shared_temp_dirs_are_private_and_capped():
    """/tmp, /var/tmp, /dev/shm, /run/lock are world-writable: the code gets its own tmpfs over
    them (4 x file_size_mb), so nothing it writes there outlives the call or fills the disk."""
    names = [f"{d}/tinyrl-sandbox-probe-{os.getpid()}" for d in ("/tmp", "/var/tmp", "/dev/shm")]
    code = textwrap.dedent(f"""
        import os
        for p in {names!r}:
            open(p, 'w').write('left behind')
        print(sorted(os.listdir('/tmp')))
        written = 0
        try:
            for i in range(8):                       # 8 x 1 MB into a 4 MB tmpfs
                with open(f'big{{i}}', 'wb') as f:
                    f.write(b'x' * (1024 * 1024 - 1))
                written += 1
        except OSError as e:
            print('stopped after', written, e.errno)
    """)
    r = run_code(code, file_size_mb=1)
    assert r.exit_code == 0, r.stderr
    listing, stopped = r.stdout.splitlines()
    assert "tinyrl-sandbox-probe" in listing and "tinyrl-sandbox-uids" not in listing  # its own /tmp
    assert stopped.startswith("stopped after") and stopped.endswith(" 28")           # ENOSPC
    assert int(stopped.split()[2]) < 4
    assert not any(os.path.exists(n) for n in names)


@pytest.mark.parametrize("attack", [
    "os.kill(os.getppid(), 9)",
    "os.killpg(os.getpgid(os.getppid()), 9)",
    "os.kill(TRAINER, 9)",
    "os.killpg(os.getpgid(TRAINER), 9)",
    "os.kill(-1, 9)",
])
def test_cannot_kill_its_parent_or_the_trainer(attack):
    code = f"import os\nTRAINER = {os.getpid()}\ntry:\n    {attack}\nexcept OSError as e:\n" \
           f"    print('refused', type(e).__name__)\nprint('still here')"
    r = run_code(code)
    # this test process is alive to read the result: that is the main assertion
    assert isinstance(r, ToolResult) and not r.timed_out
    if "getpgid(os.getppid())" in attack and not r.pid_namespace:
        # the parent (the reaper) shares the code's own group, so the code kills only itself
        assert r.killed_by == "SIGKILL", (r.stdout, r.stderr, r.message)
    else:                             # refused (EPERM as another uid / ESRCH outside its pid ns)
        assert r.stdout.endswith("still here\n"), (r.stdout, r.stderr, r.message)


def test_killing_its_own_group_ends_only_itself():
    r = run_code("import os; os.killpg(0, 9); print('unreachable')")
    assert (r.killed_by, r.timed_out, r.stdout) == ("SIGKILL", False, "")
    assert r.message == "killed by SIGKILL (killed)"


def test_children_left_running_are_killed():
    r = run_code(LEAVE_CHILDREN, timeout_s=HOSTILE_TIMEOUT_S)
    assert (r.exit_code, r.stdout) == (0, "left them running\n"), r.stderr
    # the autouse fixture asserts that neither `sleep` nor the daemon survived


THREE_CHILDREN = "import subprocess\nfor _ in range(3):\n    subprocess.Popen(['sleep', '50'])\nprint('left 3')"
DAEMON = """
import os, time
first = os.fork()
if first == 0:                  # fork, setsid, fork again, the first child exits
    os.setsid()
    if os.fork() == 0:
        time.sleep(50)
    os._exit(0)
os.waitpid(first, 0)            # the daemon runs on its own now
print('daemon started')
"""


@pytest.mark.parametrize("code, timeout_s, left", [
    (THREE_CHILDREN, 10.0, 3),                    # the code exits, its 3 children run on
    (DAEMON, 10.0, 1),                            # a double-forked setsid daemon
    ("import time; time.sleep(30)", HOSTILE_TIMEOUT_S, 0),   # timed out, nothing started: the code is no leftover
    ("import subprocess, time\nsubprocess.Popen(['sleep', '50'])\ntime.sleep(30)", HOSTILE_TIMEOUT_S, 1),
], ids=["three-children", "setsid-daemon", "timeout-alone", "timeout-one-child"])
def test_leftover_killed_counts_the_processes_the_code_left(code, timeout_s, left):
    """README: "processes the code left behind that the cleanup killed" -- alive when the code
    ended (or the clock ran out), the code process itself not counted. In a pid namespace the
    reaper's exit used to kill them before the count (0 for the first two), and a timed-out
    code process still dying was counted (1 for the third)."""
    r = run_code(code, timeout_s=timeout_s)
    assert r.timed_out == (timeout_s == HOSTILE_TIMEOUT_S), (r.stdout, r.stderr)
    assert r.leftover_killed == left, (r.stdout, r.stderr, r.message)


def test_trainer_environment_is_invisible(monkeypatch):
    secret = "tinyrl-test-secret-7f3a9c"
    monkeypatch.setenv("HF_TOKEN", secret)
    code = textwrap.dedent(f"""
        import os
        print(dict(os.environ))
        for pid in ({os.getpid()}, os.getppid()):
            try:
                print(open(f'/proc/{{pid}}/environ', 'rb').read())
            except OSError as e:
                print('environ', pid, type(e).__name__)
    """)
    r = run_code(code)
    assert r.exit_code == 0, r.stderr
    assert secret not in r.stdout + r.stderr and "HF_TOKEN" not in r.stdout
    if ROOT:                          # another uid may not read the trainer's environ
        assert f"environ {os.getpid()} PermissionError" in r.stdout
    assert "TINYRL_CACHE" not in r.stdout and "PYTHONPATH" not in r.stdout


def test_network_is_cut_where_enforced():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        code = f"import socket\ns = socket.socket(); s.settimeout(5)\ns.connect(('127.0.0.1', {port}))\nprint('connected')"
        r = run_code(code)
        if r.network == "isolated":
            assert r.exit_code == 1 and "connected" not in r.stdout
            assert "Network is unreachable" in r.stderr
            with pytest.raises(socket.timeout):
                server.accept()
        else:                         # say so: the caller can see it in every result
            assert r.network.startswith("not enforced")
    if ROOT:                          # this machine allows it (root with CAP_SYS_ADMIN): hold it to that
        assert r.network == "isolated"


def test_setuid_binaries_run_without_their_privileges():
    """NoNewPrivs was 0: a setuid-root binary the code ran (passwd, mount, chsh are on this
    machine) ran as root. With no_new_privs the kernel ignores setuid bits and file capabilities."""
    r = run_code("import subprocess\n"
                 "print(open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0])\n"
                 "print(subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True)"
                 ".stdout.split('NoNewPrivs:')[1].split()[0])")
    assert r.stdout.split() == ["1", "1"], r.stderr      # the code and what it starts


def test_uid_locks_are_seen_by_a_trainer_with_another_temp_dir(tmp_path):
    """The locks lived under the temp dir: two root trainers with different TMPDIRs took the same
    uid, and each call's start killed the other's processes under it."""
    uid = UID_BASE + UID_SLOTS + 7    # no call's slot: only this test takes it
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from tinyrl.tools.python import lock_uid\n"
         "print(lock_uid(int(sys.argv[1])) is not None, flush=True); time.sleep(60)", str(uid)],
        env={**os.environ, "TMPDIR": str(tmp_path)}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "True\n"
        assert lock_uid(uid) is None
    finally:
        holder.kill()
        holder.wait()
    fd = lock_uid(uid)
    assert fd is not None
    os.close(fd)


def test_a_uid_lock_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    lock_dir = tmp_path / "uids"
    lock_dir.mkdir()
    lock_dir.chmod(0o777)             # as a user who made it first in /tmp could leave it
    monkeypatch.setattr(sandbox, "UID_LOCK_DIR", lock_dir)
    with pytest.raises(TinyRLError, match="only this user") as caught:
        lock_uid(UID_BASE)
    assert f"rm -rf {lock_dir}" in caught.value.hint


@pytest.mark.skipif(not ROOT, reason="the per-call uid exists only when the trainer is root")
def test_concurrent_calls_run_under_distinct_unprivileged_uids():
    groups = os.getgroups()
    os.setgroups([0, 27])             # give the trainer supplementary groups the code must not keep
    try:
        results = run_many(["import os, time; time.sleep(1); print(os.getuid(), os.getgid(), os.getgroups())"] * 4,
                           max_workers=4)
    finally:
        os.setgroups(groups)
    ids = [r.stdout.split()[0] for r in results]
    assert len(set(ids)) == 4 and all(UID_BASE <= int(i) < UID_BASE + UID_SLOTS for i in ids)
    assert all(r.stdout.split()[1] == r.stdout.split()[0] and r.stdout.split()[2] == "[]" for r in results)


def test_launcher_killed_from_outside_takes_the_code_with_it():
    """If the launcher dies (OOM killer, a stray kill), its reaper and the code die with it
    (PR_SET_PDEATHSIG; as root the trainer's own uid sweep too) and the call still returns."""
    box: list[ToolResult] = []
    # Children this process had before the call (another test's long-lived verifier or reward
    # worker in the same pytest worker) are not the launcher, and not the code's children.
    before = {p.pid for p in procs.processes() if p.ppid == os.getpid()}
    call = threading.Thread(target=lambda: box.append(run_code(LEAVE_CHILDREN + "\nwhile True: pass", timeout_s=60)))
    call.start()
    for _ in range(600):              # wait until the code has started its children
        live = procs.processes()
        launchers = [p.pid for p in live if p.ppid == os.getpid() and p.pid not in before]
        # reaper, code and at least one of the code's children below the launcher
        if launchers and len(procs.descendants(launchers[0], live)) >= 3:
            break
        threading.Event().wait(0.05)
    os.kill(launchers[0], 9)
    call.join(timeout=60)
    assert not call.is_alive()
    r = box[0]
    assert not r.timed_out and r.exit_code == -9 and r.seconds < 60
    assert r.message.startswith("the sandbox launcher ended without a result (exit status -9)")


CALLER = """
from tinyrl.tools.python import run_code
run_code("print('in the call', flush=True)\\nimport time\\ntime.sleep(60)", timeout_s=60)
"""


def _mid_call(caller: subprocess.Popen) -> Path:
    """The call directory of `caller` (its pid is in the name) once the code runs in it."""
    for _ in range(1200):
        for d in Path(tempfile.gettempdir()).glob(f"tinyrl-sandbox-{caller.pid}-*"):
            if (d / "stdout").exists() and b"in the call" in (d / "stdout").read_bytes():
                return d
        assert caller.poll() is None, caller.communicate()
        threading.Event().wait(0.05)
    raise AssertionError("the caller never got into its call")


def _call_processes(d: Path) -> list[int]:
    """Launcher, reaper and code of the call in `d`: all three run the launcher's command line."""
    return [p.pid for p in procs.processes() if str(d) in _cmdline(p.pid)]


def test_directory_of_a_sigkilled_caller_goes_with_the_next_call():
    """SIGKILL cannot be caught: a caller killed mid-call leaves its directory (spec, output,
    work/ owned by the sandbox uid as root). The next call of any process removes it, and
    keeps the directory of a caller that is alive (a second tinyrl run)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    callers = [subprocess.Popen([sys.executable, "-c", CALLER], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE) for _ in range(2)]
    dirs: list[Path] = []
    try:
        dirs = [_mid_call(c) for c in callers]
        killed, live = callers
        killed.kill()
        killed.wait()
        assert (dirs[0] / "spec.json").exists() and (dirs[0] / "work").is_dir()   # left behind
        assert run_code("print(1)").stdout == "1\n"
        assert not dirs[0].exists()               # swept by the next call
        assert (dirs[1] / "spec.json").exists() and live.poll() is None   # a live caller's: kept
        live.kill()
        live.wait()
        assert run_code("print(2)").stdout == "2\n" and not dirs[1].exists()
    finally:
        for c in callers:
            c.kill()
            c.communicate()
        # the killed callers' launchers would finish their calls at the timeout: end them now
        # (the reaper and the code die with the launcher: PR_SET_PDEATHSIG)
        for d in dirs:
            for pid in _call_processes(d):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
        for _ in range(400):
            if not any(_call_processes(d) for d in dirs):
                break
            threading.Event().wait(0.05)
        assert not any(_call_processes(d) for d in dirs)
        sweep_stale_dirs()
        assert not any(d.exists() for d in dirs)


def test_sweep_removes_only_directories_whose_creator_is_gone(tmp_path):
    """Named by the creator's pid, start time, pid namespace and boot: a reused pid (another
    start time) and another boot are stale; this live process's, another pid namespace's (its
    pids cannot be checked from here) and anything named otherwise are kept."""
    pid, start, ns, boot = _dir_prefix()[len("tinyrl-sandbox-"):-1].split("-")
    other_boot = "0" * 8 if boot != "0" * 8 else "1" * 8
    names = {
        "live": f"{_dir_prefix()}live0000",
        "reused pid": f"tinyrl-sandbox-{pid}-{int(start) + 1}-{ns}-{boot}-reused00",
        "gone pid": f"tinyrl-sandbox-{2 ** 22 + 7}-{start}-{ns}-{boot}-gone0000",  # above pid_max
        "other namespace": f"tinyrl-sandbox-{2 ** 22 + 7}-{start}-{int(ns) + 1}-{boot}-otherns0",
        "other boot": f"tinyrl-sandbox-{pid}-{start}-{int(ns) + 1}-{other_boot}-boot0000",
        "uid locks": "tinyrl-sandbox-uids",
        "old style": "tinyrl-sandbox-abc_1234",
    }
    for name in names.values():
        (tmp_path / name / "work").mkdir(parents=True)
        (tmp_path / name / "work" / "f").write_text("x")
        if ROOT:                      # as a call leaves it: work/ is the sandbox uid's, 0700
            os.chown(tmp_path / name / "work", UID_BASE + 1, UID_BASE + 1)
            os.chown(tmp_path / name / "work" / "f", UID_BASE + 1, UID_BASE + 1)
            os.chmod(tmp_path / name / "work", 0o700)
    removed = sweep_stale_dirs(str(tmp_path))
    assert sorted(Path(p).name for p in removed) == sorted(names[k] for k in ("reused pid", "gone pid", "other boot"))
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        sorted(names[k] for k in ("live", "other namespace", "uid locks", "old style"))


def test_code_runs_at_a_lower_priority():
    assert run_code("import os; print(os.nice(0))").stdout == f"{os.nice(0) + 10}\n"


@pytest.mark.skipif(not ROOT, reason="the per-call uid exists only when the trainer is root")
def test_a_uid_with_an_account_is_never_used(monkeypatch):
    import pwd

    taken = set(range(UID_BASE, UID_BASE + 3))
    real = pwd.getpwuid

    def fake(uid):                    # pretend the first three sandbox uids are real accounts
        if uid in taken:
            return ("someone",)
        return real(uid)
    monkeypatch.setattr(sandbox.pwd, "getpwuid", fake)
    uid = int(run_code("import os; print(os.getuid())").stdout)
    assert uid not in taken and UID_BASE + 3 <= uid < UID_BASE + UID_SLOTS   # +3 unless another call holds it


# ---- the batch while the trainer trains -------------------------------------------------

HOSTILE = [
    "while True: pass",
    FORK_BOMB,
    "while True: print('x' * 1000)",
    "b = bytearray(10**10)",
    "open('/etc/tinyrl-sandbox-probe', 'w').write('x')",
    "import os; os.kill(os.getppid(), 9)",
    "import os; os.killpg(0, 9)",
    "import os; os.kill(-1, 9)",
    LEAVE_CHILDREN,
    "import os; print(dict(os.environ))",
    "import socket; socket.create_connection(('127.0.0.1', 1), timeout=2)",
    "print(sum(range(10)))",
]


def _train(steps: int, keep_going=None) -> tuple[list[torch.Tensor], int]:
    """A small real training run (MLP, Adam, fixed seed). With `keep_going`, it runs at least
    `steps` steps and then on while keep_going() is true. Returns (parameters, steps run)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(512, 32), torch.randn(512, 1)
    done = 0
    while done < steps or (keep_going is not None and keep_going()):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        done += 1
    return [p.detach().clone() for p in model.parameters()], done


def test_hostile_batch_beside_training_changes_nothing():
    results: list[ToolResult] = []
    batch = threading.Thread(target=lambda: results.extend(
        run_many(HOSTILE, max_workers=4, timeout_s=HOSTILE_TIMEOUT_S)))
    batch.start()
    params, steps = _train(20, keep_going=batch.is_alive)   # trains for as long as the batch runs
    batch.join()
    quiet, _ = _train(steps)
    assert all(torch.equal(a, b) for a, b in zip(params, quiet))   # bit for bit
    assert len(results) == len(HOSTILE) and all(isinstance(r, ToolResult) for r in results)
    assert [r.timed_out for r in results[:2]] == [True, True]
    assert all(r.seconds < HOSTILE_TIMEOUT_S + SLACK_S for r in results)
    assert results[-1].stdout == "45\n"
    assert "HF_TOKEN" not in results[9].stdout
    for r in results:                 # each one reads as a tool turn
        assert render(r).strip()


# ---- the registry and the tool turn -----------------------------------------------------

def test_registry_schema_and_run():
    tool = TOOLS["code_interpreter"]
    fn = tool.schema["function"]
    assert tool.schema["type"] == "function" and fn["name"] == "code_interpreter" == tool.name
    assert fn["parameters"]["required"] == ["code"] and fn["parameters"]["properties"]["code"]["type"] == "string"
    json.dumps(tool.schema)           # goes into a chat template / verl's tool YAML as it is
    assert tool.run({"code": "print(2 ** 10)"}).stdout == "1024\n"
    assert tool.run({"code": "print(n ** 2)"}, {"setup": "n = 12"}).stdout == "144\n"  # an episode's create_kwargs
    assert tool.run({"code": "print(2)"}, {}).stdout == "2\n"


def _result(**kw) -> ToolResult:
    base = dict(stdout="", stderr="", exit_code=0, timed_out=False, killed_by=None, truncated=False,
                seconds=0.1, message="exit code 0", network="isolated", pid_namespace=True)
    return ToolResult(**{**base, **kw})


def test_render_order_and_status_line():
    assert render(_result(stdout="42\n")) == "42"
    r = _result(stdout="a\n", stderr="Traceback\nValueError: v\n", exit_code=1, message="exit code 1: ValueError: v")
    assert render(r) == "a\nTraceback\nValueError: v\n[exit code 1: ValueError: v]"
    t = _result(stdout="partial\n", exit_code=-9, timed_out=True, killed_by="SIGKILL", message="timed out after 10 s")
    assert render(t) == "partial\n[timed out after 10 s]"
    assert render(_result(stdout="x", truncated=True, message="exit code 0; output truncated")) == \
        "x\n[exit code 0; output truncated]"


def test_removing_a_call_directory_never_changes_the_directory_holding_it(tmp_path):
    """When the call directory itself could not be removed (another process's sweep had removed
    it first), the cleanup chmod'ed its parent, the temp dir, to 0700: /tmp was found 0700 and
    every non-root user of the machine (the non-root sandbox test too) lost it."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    sandbox._rmtree(str(shared / "tinyrl-sandbox-gone"))      # removed already: nothing to do
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    call = shared / "tinyrl-sandbox-call"
    (call / "work" / "locked").mkdir(parents=True)
    (call / "work" / "locked" / "f").write_text("x")
    (call / "work" / "locked").chmod(0)                        # as the code may leave its own files
    sandbox._rmtree(str(call))
    assert not call.exists() and stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_read_output_keeps_head_and_tail(tmp_path):
    f = tmp_path / "out"
    f.write_bytes(b"A" * 50 + b"B" * 1000 + b"C" * 50)
    text, cut = _read_output(f, 100)
    assert cut and text == "A" * 50 + "\n[... 1000 bytes cut ...]\n" + "C" * 50
    f.write_bytes(b"short")
    assert _read_output(f, 100) == ("short", False)


# ---- not root: the user's machine --------------------------------------------------------

# Outside the slot range, so no call of the sandbox uses them. Its last check (no process of the
# uid is left) would see the processes of another CI run on the same machine using the same uid
# (scripts/ci-soak -j 2 runs two at once: it failed once that way), so the test holds its uid
# the way a call holds a slot (flock), instead of hoping that two pids differ modulo 1000.
NONROOT_UIDS = range(UID_BASE + UID_SLOTS + 900, UID_BASE + UID_SLOTS + 1900)


@pytest.fixture
def nonroot_uid():
    for uid in NONROOT_UIDS:
        fd = sandbox.lock_uid(uid)
        if fd is None:
            continue
        try:
            yield uid
        finally:
            os.close(fd)
        return
    pytest.fail("every uid of NONROOT_UIDS is held")

NONROOT_SCRIPT = """
import json, os, sys
from tinyrl.tools.python import run_code
out = {}
for name, code in json.loads(sys.argv[1]).items():
    r = run_code(code, timeout_s=2)
    out[name] = [r.stdout, r.exit_code, r.timed_out, r.network, r.pid_namespace, r.leftover_killed]
print(json.dumps(out))
"""


@pytest.mark.skipif(not ROOT or not os.path.exists("/usr/bin/python3"),
                    reason="needs root to start an unprivileged process, and a system python3 it can run")
def test_not_root_mode_through_an_unprivileged_process(nonroot_uid):
    """The same API as a plain user: no uid switch; the process group, the subreaper, the
    namespaces a user may create (here: user+net+pid) and PR_SET_PDEATHSIG do the work.
    Runs on the system python (stdlib only), as the venv's interpreter sits below a 0700 /root."""
    snippets = {"ok": "print('hi')", "loop": "while True: pass", "children": LEAVE_CHILDREN,
                "killall": "import os\ntry: os.kill(-1, 9)\nexcept OSError: pass\nprint('alive')",
                "net": "import socket; socket.create_connection(('127.0.0.1', 1), timeout=1)"}
    # the checkout may sit where that uid cannot read (a clone below /root): give it a copy of
    # the few modules it imports, in a directory it can read
    src = Path(tempfile.mkdtemp(prefix="tinyrl-nonroot-test-"))
    try:
        os.chmod(src, 0o755)
        pkg = src / "tinyrl"
        shutil.copytree(REPO / "tinyrl" / "tools", pkg / "tools",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("__init__.py", "_compat.py", "errors.py", "printsink.py"):
            shutil.copy(REPO / "tinyrl" / name, pkg / name)
        for d in [src, *src.rglob("*")]:
            os.chmod(d, 0o755 if d.is_dir() else 0o644)
        proc = subprocess.run(
            ["/usr/bin/python3", "-c", NONROOT_SCRIPT, json.dumps(snippets)], capture_output=True,
            text=True, user=nonroot_uid, group=nonroot_uid, extra_groups=[], cwd="/",
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(src), "HOME": "/tmp"}, timeout=120)
    finally:
        shutil.rmtree(src)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"][:3] == ["hi\n", 0, False]
    assert out["loop"][2] is True and out["loop"][5] == 0
    assert out["children"][:2] == ["left them running\n", 0]
    assert out["children"][5] == 2             # the `sleep` and the daemon
    assert out["killall"][0] == "alive\n"      # the runner survived: kill(-1) stayed in the pid ns
    if out["net"][3] == "isolated":
        assert out["net"][1] == 1
    assert not [p for p in procs.processes() if nonroot_uid in p.uids]
