"""A run directory belongs to one run, written by one process at a time (issue 29).

    RUN_DIR/.tinyrl.lock   the owner: an OS lock (flock) held while `tinyrl train|sft` runs; the
                           file holds the owner's pid. The OS drops the lock when the process
                           ends in any way (SIGKILL included), so there is nothing stale to clean.
    RUN_DIR/run.json       {"run_id", "started", "cwd"}: written when a run starts; every checkpoint
                           carries the same id (its meta.json), so --resume knows the
                           checkpoint is this run's and a new run never adopts another's.

flock, not a pid file: a pid file outlives a killed process and its pid may be reused. The lock
is on the open file, so forked children (vLLM's workers, DataLoader processes) close their copy
(os.register_at_fork): a child that outlives a killed trainer does not keep the directory locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from pathlib import Path
from typing import Iterator

from tinyrl.errors import TinyRLError
from tinyrl.writable import check_writable

LOCK_FILE = ".tinyrl.lock"
RUN_FILE = "run.json"

_held: dict[Path, int] = {}  # resolved run dir -> the lock's fd, in this process


def _close_in_child() -> None:
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


def _open_dir(run_dir: Path) -> Path:
    check_writable(run_dir)  # --out a file, inside one, or on a read-only disk: said plainly first
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise TinyRLError(f"--out {run_dir} is a file, not a directory", hint="choose a directory for --out") from None
    except OSError as exc:
        raise TinyRLError(f"cannot create the run directory {run_dir}: {exc.strerror or exc}",
                          hint="choose a writable --out directory") from None
    return run_dir.resolve()


@contextlib.contextmanager
def claim(run_dir: Path, command: str = "train") -> Iterator[None]:
    """Own `run_dir` for the body (the command's life): exit 2 naming the holder's pid when
    another process owns it. Re-entrant within one process (the CLI called twice in-process).
    When the command leaves nothing but the lock file this claim created and empty files it
    opened (it stopped at a bad input, or refused the directory, before writing anything), they
    are removed again, and so are a directory this claim made and the folders above it that it
    made and that are empty then (`runs/` of a first `--out runs/NAME`): a refused `--out` of the
    user's is left as it was. What was there before the lock was taken is never touched."""
    made = [d for d in (Path(run_dir).absolute(), *Path(run_dir).absolute().parents) if not d.exists()]
    key = _open_dir(run_dir)
    if key in _held:
        yield
        return
    path = key / LOCK_FILE
    fd, created = _open_lock(path, run_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode(errors="replace").split()
        os.close(fd)
        pid = holder[0] if holder else "unknown"
        what = " ".join(holder[1:]) or "tinyrl"
        raise TinyRLError(
            f"{run_dir} is in use by another tinyrl process (pid {pid}, {what}); two runs in one "
            "directory would mix their metrics and checkpoints. Nothing was changed",
            hint=f"wait for it to end, or stop it (kill {pid}; --resume continues it later), or give this "
                 "run another --out") from None
    owner = os.getpid()  # a forked child that unwinds through the finally below is not the owner
    # what the directory held when this process came to own it: the user's, never removed (taken
    # under the lock, so no other tinyrl process was writing there)
    before = {p.name for p in key.iterdir()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{owner} tinyrl {command} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
    _held[key] = fd
    try:
        yield
    finally:
        # Unlocked by closing; the file stays (removing it would race a process opening it),
        # except when this claim created it and nothing was written beside it: unlinked while
        # still locked, so a process that opened it meanwhile was refused, and one that opens it
        # now makes a new file, which keeps a made directory (rmdir fails on it).
        _held.pop(key, None)
        if created and os.getpid() == owner:
            _remove_if_unused(key, before, made)
        with contextlib.suppress(OSError):  # a forked child that got here closed it already
            os.close(fd)


def _open_lock(path: Path, run_dir: Path) -> tuple[int, bool]:
    """The lock file's fd, and whether this call created it (O_EXCL says so, race-free): only a
    lock file this claim created is removed again (_remove_if_unused)."""
    try:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), True
        except FileExistsError:
            return os.open(path, os.O_RDWR | os.O_CLOEXEC), False
    except OSError as exc:
        raise TinyRLError(f"cannot write in the run directory {run_dir}: {exc.strerror or exc}",
                          hint="choose a writable --out directory") from None


def _remove_if_unused(key: Path, before: set[str], made: list[Path]) -> None:
    """The lock file and the empty files this run opened (reward_prints.log, opened once the
    reward loaded, when a later input check stopped the start), when nothing else is new in
    `key`; then `key` and the folders above it when this claim made them. Until 2026-11-28 a
    refused --out of the user's (another run's metrics, a model directory) kept a .tinyrl.lock."""
    with contextlib.suppress(OSError):
        new = [p for p in key.iterdir() if p.name not in before and p.name != LOCK_FILE]
        if not all(p.is_file() and not p.is_symlink() and p.stat().st_size == 0 for p in new):
            return
        for p in new:
            p.unlink()
        (key / LOCK_FILE).unlink()
        if made:
            key.rmdir()
            for parent in made[1:]:  # up to the first that is not empty (rmdir fails: kept)
                parent.rmdir()


def other_holder(run_dir: Path) -> str | None:
    """Who holds `run_dir`'s lock, when another live process does: its lock file's text
    ("12345 tinyrl train since 2026-01-02 03:04:05"), else None (no run there, or it ended; the
    file outlives it). Looks without taking the lock (a probe would refuse a `tinyrl train`
    starting that instant): Linux lists each held flock in /proc/locks by device and inode.
    Where that listing cannot be matched to the file (no /proc/locks; btrfs subvolumes and
    overlay mounts, where stat's device is not the one /proc/locks prints), a shared lock taken
    and dropped at once answers instead, if the pid in the file is still alive."""
    path = Path(run_dir) / LOCK_FILE
    try:
        if path.resolve().parent in _held:  # this process's own run (the CLI after a train)
            return None
        st = path.stat()
        text = path.read_text(errors="replace").strip() or "unknown"
    except OSError:
        return None
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    if any("FLOCK" in line and ident in line.split() for line in proc_locks().splitlines()):
        return text
    if not _alive(text.split()[0]):  # the run that wrote it ended (the file outlives it)
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return text
    finally:
        os.close(fd)  # drops the shared lock, if taken


def proc_locks() -> str:
    """Linux's list of held file locks ("" where there is none to read)."""
    try:
        return Path("/proc/locks").read_text()
    except OSError:
        return ""


def _alive(pid: str) -> bool:
    """Whether the lock file's pid names a live process (True when it cannot be told)."""
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, another user's
        return True
    return True


def starting_run(run_dir: Path) -> TinyRLError | None:
    """A run directory another process has claimed and not yet written its config.json into (a
    `tinyrl train` still loading its model and data): the error for a reader of its checkpoints
    (`eval`, `export`), which said "not a run directory", else None."""
    holder = other_holder(run_dir) if not (Path(run_dir) / "config.json").exists() else None
    if holder is None:
        return None
    pid, _, what = holder.partition(" ")
    return TinyRLError(f"{run_dir} is a run still starting (pid {pid}{', ' + what if what else ''}): it has no "
                       "checkpoint yet, nothing of it can be loaded",
                       hint="wait for its first checkpoint (`trainer.save_every`, and its last step)")


# What a run writes at the top of its directory (beside checkpoints/ and report/).
RUN_FILES = ("config.json", RUN_FILE, "metrics.jsonl", "samples.jsonl", "timeline.jsonl", "metrics.parquet")


def is_run_dir(path: Path) -> bool:
    """A tinyrl run directory: its config.json is tinyrl's (sections such as `trainer`), not a
    Hugging Face model's (`model_type`), whether or not it holds a checkpoint yet."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and "trainer" in raw and "model_type" not in raw


def check_new_run(run_dir: Path) -> None:
    """A new run (no --resume) starts only in a directory that holds no other run's results, and
    no file of the user's that a run writes over (config.json, timeline.jsonl, ...)."""
    from tinyrl import checkpoint as ckpt

    done = ckpt.list_checkpoints(run_dir / "checkpoints")
    if (run_dir / "metrics.jsonl").exists():
        # Most often a finished run met again (the SFT run the demos share, run a second time):
        # say what it holds and how to use it as it is, not only how to continue it.
        from tinyrl.config import presets_starting_from

        last = f"its last checkpoint is step {ckpt.step_of(done[-1])}" if done else "it has no checkpoint"
        starting = presets_starting_from(run_dir)
        use = (f"presets that start from it as it is (model.init_from): {', '.join(f'`{c}`' for c in starting)}"
               if starting else f"to train from it as it is: --set model.init_from={run_dir}")
        raise TinyRLError(f"{run_dir} already holds a run (metrics.jsonl; {last}); nothing was changed",
                          hint=f"{use}; to continue it: add --resume (from its last checkpoint, or from step 0 if "
                               "it has none); for a new run: choose another --out directory")
    if done:
        steps = ", ".join(str(ckpt.step_of(p)) for p in done)
        raise TinyRLError(
            f"{run_dir / 'checkpoints'} holds checkpoints this new run did not write (step {steps}); "
            "a new run there would prune them as its own and a later --resume would continue from them. "
            "Nothing was changed",
            hint="add --resume to continue the run they belong to, or choose another --out directory"
            if (run_dir / "config.json").is_file() else
            # no run beside them (checkpoints/ copied in alone): --resume has nothing to continue
            f"no run's config.json is beside them, so --resume cannot continue them here: resume the run they "
            f"came from in its own directory, or move {run_dir / 'checkpoints'} away, or choose another --out directory")
    theirs = [name for name in RUN_FILES if (run_dir / name).exists()]
    if theirs and not is_run_dir(run_dir):
        # until 2026-11-27 `train --out DIR` wrote its config.json over an exported model's, which
        # no loader then read, and appended to a timeline.jsonl of the user's
        from tinyrl.export_info import read_export

        what = "a model directory (`tinyrl export` of a run)" if read_export(run_dir) else \
            "not a tinyrl run" + (" (config.json is not a run's config)" if "config.json" in theirs else "")
        raise TinyRLError(f"{run_dir} holds {', '.join(theirs)}, which a run writes over, and is {what}; "
                          "nothing was changed",
                          hint="give --out a new or empty directory (runs/NAME), or move those files away")


def start_run(run_dir: Path) -> str:
    """A new run: its id, written to RUN_DIR/run.json (replacing a run that never checkpointed)."""
    run_id = _new_id()
    _write_id(run_dir, run_id)
    return run_id


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


def _write_id(run_dir: Path, run_id: str) -> None:
    from tinyrl.jsonl import write_atomic

    # cwd: the run's relative paths (data, model.init_from, a reward file) start there (start_dir)
    write_atomic(run_dir / RUN_FILE, json.dumps({"run_id": run_id, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                 "cwd": os.getcwd()}))


def record_resume_command(run_dir: Path, command: str) -> None:
    """The command that continues this run, kept in run.json: after a kill -9 or a crash nothing
    printed it, and `--resume` needed every --set of the start typed again (resumed_args)."""
    from tinyrl.jsonl import write_atomic

    path = run_dir / RUN_FILE
    write_atomic(path, json.dumps({**json.loads(path.read_text()), "resume": command}))


def check_has_run(run_dir: Path) -> None:
    """--resume of a directory without a run: said before it is claimed (a lock file left in a
    new, mistyped --out) or anything loads."""
    from tinyrl import checkpoint as ckpt

    if not (run_dir / "config.json").is_file():
        why = "no config.json" if run_dir.exists() else "no such directory"
        orphans = ckpt.list_checkpoints(run_dir / "checkpoints")  # copied in alone: a new run refuses them too
        raise TinyRLError(f"--resume: {run_dir} holds no run ({why})",
                          hint=f"{run_dir / 'checkpoints'} holds checkpoints but no run's config.json is beside them: "
                               "resume the run they came from in its own directory, or move them away and start a "
                               "new run" if orphans else
                               "run without --resume to start one, or pass the run's --out directory")


def resumed_args(run_dir: Path) -> tuple[str, list[str]]:
    """(--preset, the --set items) of the command run.json keeps (record_resume_command), for a
    `--resume` given without --preset; exit 2 when the run keeps none."""
    import shlex

    check_has_run(run_dir)  # no run there at all (a mistyped --out): said as such, not as a missing --preset
    kept = _read_id(run_dir / RUN_FILE, "resume") if (run_dir / RUN_FILE).is_file() else None
    if kept is None:
        raise TinyRLError(f"--preset is needed: {run_dir} keeps no command to continue it (no run.json, or a run "
                          "started before 2026-11-28)",
                          hint=f"give the --preset and --set options it was started with ({run_dir}/config.json "
                               "holds its settings)")
    words = shlex.split(kept)
    preset = words[words.index("--preset") + 1]
    return preset, [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]


def start_dir(run_dir: Path) -> Path | None:
    """The directory the run was started in (run.json's cwd); None for a run begun before it was kept."""
    if not (run_dir / RUN_FILE).is_file():
        return None
    where = _read_id(run_dir / RUN_FILE, "cwd")
    return Path(where) if where else None


def _map_paths(cfg, fn) -> None:
    """fn(value, setting) -> value over every setting that names a file or directory: the data
    files, model.init_from, model.name (a local model), a chat template file, a reward file."""
    from tinyrl.eval import parse_data_args

    d, m, r = cfg.data, cfg.model, cfg.reward
    d.train_path, d.test_path = fn(d.train_path, "data.train_path"), fn(d.test_path, "data.test_path")
    m.init_from, m.name = fn(m.init_from, "model.init_from"), fn(m.name, "model.name")
    d.val_files = [f"{name}={fn(str(path), 'data.val_files')}" for name, path in parse_data_args(d.val_files)]
    if "{" not in m.custom_chat_template:  # a file's path, not the template's text
        m.custom_chat_template = fn(m.custom_chat_template, "model.custom_chat_template")

    def file_spec(spec: str, setting: str) -> str:  # reward.fn = file.py:func
        where, _, func = spec.rpartition(":")
        return f"{fn(where, setting)}:{func}" if where.endswith(".py") else spec

    r.fn, r.extra_fns = file_spec(r.fn, "reward.fn"), [file_spec(s, "reward.extra_fns") for s in r.extra_fns]
    cfg.task.extra_tools = [file_spec(s, "task.extra_tools") for s in cfg.task.extra_tools]  # file.py:NAME


def _elsewhere(run_dir: Path) -> Path | None:
    """The directory the run was started in, when it is not this one."""
    start = start_dir(run_dir)
    return None if start is None or start.resolve() == Path.cwd().resolve() else start


def _from_start(value: str, start: Path, note=None, setting: str = "") -> str:
    """One of the run's relative paths as the run read it, whatever this directory holds under
    that name: start/value (start: the directory the run was started in), else the file tinyrl
    ships under it (config.resolve_path's rule, as the run applied it there). When neither is
    there any more (the file deleted since, the run directory copied to another machine), the
    file of that name found from here is the one read, and note(...) says so (not when note is
    None: seen_from_here only names it); nowhere at all, the value is kept for the reader's own
    'not found'."""
    from tinyrl.config import resolve_path, shipped_path

    path = Path(value).expanduser() if value else None
    if path is None or path.is_absolute():
        return value
    if (start / path).exists():
        return str(start / path)
    if (shipped := shipped_path(path)) is not None:
        return str(shipped)
    here = resolve_path(value)
    if note is not None and here.exists():
        note(f"{setting} = {value} is not in {start}, where the run was started: read {here.resolve()} from here "
             "instead, which may not be the file the run read")
    return value


def seen_from_here(value: str, run_dir: Path) -> str:
    """One of the run's relative paths as this directory reaches it (rebase_paths, for one value)."""
    start = _elsewhere(run_dir)
    return value if start is None else _from_start(value, start)


def rebase_paths(cfg, run_dir: Path) -> None:
    """The run's relative paths (data files, model.init_from, a local model, a chat template, a
    reward file) as the run read them: from the directory it was started in (run.json's cwd),
    whatever this directory holds under the same names (_from_start). For every reader of a
    finished run's own files: export, eval, `export-verl --from-run`, `estimate-cost --from-run`.
    A file no longer there is read from here, said on stderr (a warning of this module's logger).
    Until 2026-11-28 a path went to the start only when it was not found from here: from a sibling
    directory holding its own mydata/train.parquet and my_reward.py, export-verl exported those
    and estimate-cost counted their rows, exit 0 without a word."""
    import logging

    def note(line: str) -> None:
        logging.getLogger(__name__).warning("%s: %s", run_dir, line)

    if start_dir(run_dir) is None:  # begun before run.json kept its cwd: nothing says where its paths start
        _note_unrecorded_start(cfg, note)
        return
    start = _elsewhere(run_dir)
    if start is not None:
        _map_paths(cfg, lambda value, setting: _from_start(value, start, note, setting))


def _note_unrecorded_start(cfg, note) -> None:
    """A run without run.json's cwd: its relative paths found from here (not a file tinyrl ships,
    the same wherever the run started) are read from here, said as _from_start's fallback is."""
    from tinyrl.config import shipped_path

    here: list[str] = []

    def found_here(value: str, setting: str) -> str:
        path = Path(value).expanduser() if value else None
        if path is not None and not path.is_absolute() and path.exists() and shipped_path(path) is None:
            here.append(f"{setting} = {value}")
        return value

    _map_paths(cfg, found_here)  # values kept: only `here` is used
    if here:
        note(f"the run does not record where it was started (its run.json has no cwd: a run from before "
             f"2026-11-26), so its relative paths are read from here ({Path.cwd()}): {', '.join(here)}; "
             "if the run was started elsewhere, run this from there")


def check_resume_here(run_dir: Path, resume_cmd: str) -> None:
    """--resume from another directory than the run's start, when a relative path of the run
    names something there that is not the same thing here: the run would read other files (or
    none) under the same settings. Said before the config is checked, data generated or a model
    loaded: a relative model.name was tried as a Hugging Face id, model.init_from was 'not a run
    directory', and the preset's data was generated afresh in the wrong place."""
    import shlex

    from tinyrl.config import config_from_dict, resolve_path

    start = _elsewhere(run_dir)
    if start is None or not (run_dir / "config.json").is_file():
        return
    try:
        cfg = config_from_dict(json.loads((run_dir / "config.json").read_text()))
    except (OSError, ValueError, TypeError, TinyRLError):
        return  # the resume's own checks say what is wrong with it
    moved: list[str] = []

    def differs(value: str, _setting: str) -> str:
        path = Path(value).expanduser() if value else None
        if path is not None and not path.is_absolute() and (start / path).exists():
            here = resolve_path(value)
            if not here.exists() or here.resolve() != (start / path).resolve():
                moved.append(value)
        return value

    _map_paths(cfg, differs)  # a throwaway config: only `moved` is kept
    if moved:
        run = Path(os.path.relpath(run_dir.resolve(), start))
        again = resume_cmd.replace(f" --out {shlex.quote(str(run_dir))} ", f" --out {shlex.quote(str(run))} ")
        raise TinyRLError(
            f"--resume: {run_dir} was started in {start}, and its settings name "
            + ", ".join(moved) + f" from there, which {'is' if len(moved) == 1 else 'are'} not the same here "
            f"({Path.cwd()}); resumed from here the run would read other files under the same settings. "
            "Nothing was changed",
            hint=f"resume it from where it started: cd {shlex.quote(str(start))} && {again}")


def _read_id(path: Path, key: str) -> str | None:
    try:
        value = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError) as exc:
        raise TinyRLError(f"cannot read {path}: {exc}",
                          hint="restore it from a copy, or start a new run in another --out") from None
    return None if value is None else str(value)


def _meta_id(checkpoint: Path) -> str | None:
    """A checkpoint's run id; None when it has none or its meta.json is torn (loading it then
    finds it damaged and falls back: tinyrl.checkpoint.load_checkpoint)."""
    try:
        return _read_id(checkpoint / "meta.json", "run_id")
    except TinyRLError:
        return None


def resume_run(run_dir: Path) -> tuple[str, list[str]]:
    """--resume, before anything loads: every checkpoint must be this run's (its meta.json's
    run_id = RUN_DIR/run.json's), else exit 2 naming both. -> (the run id, notices).
    A run begun before run ids (no run.json) gets one now; checkpoints without an id (written
    before run ids) are accepted, said in a notice: nothing tells them apart."""
    from tinyrl import checkpoint as ckpt

    done = ckpt.list_checkpoints(run_dir / "checkpoints")
    ids = {p: _meta_id(p) for p in done}
    ours = _read_id(run_dir / RUN_FILE, "run_id") if (run_dir / RUN_FILE).is_file() else None
    notices = []
    if ours is None:  # an older tinyrl's run: config.json (checked already) is all there is to go by
        found = {i for i in ids.values() if i is not None}
        ours = found.pop() if len(found) == 1 else _new_id()
        _write_id(run_dir, ours)
        notices.append(f"--resume: {run_dir} had no {RUN_FILE} (begun before run ids); its run id is now {ours}")
    foreign = {p: i for p, i in ids.items() if i is not None and i != ours}
    if foreign:
        raise TinyRLError(
            f"--resume: {run_dir / 'checkpoints'} holds checkpoints of another run: "
            + ", ".join(f"{p.name} (run {i})" for p, i in foreign.items())
            + f"; this directory's run is {ours} ({run_dir / RUN_FILE}). Continuing would train another run's "
            "weights under this run's settings. Nothing was changed",
            hint="resume the run they belong to from its own directory, or move them away, or start a new run "
                 "in another --out")
    legacy = [p.name for p, i in ids.items() if i is None]
    if legacy:
        notices.append(f"--resume: {', '.join(legacy)} predate run ids; taken as this run's ({ours})")
    return ours, notices
