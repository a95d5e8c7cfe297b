"""A run directory belongs to one run (issue 29, items 1-2), with the real CLI in real processes:
a second `tinyrl train` (or `sft`) into a directory another process owns is refused naming its
pid; a SIGKILLed owner frees it; a new run refuses another run's checkpoints; --resume refuses a
checkpoint of another run and continues its own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import hold_run_lock
from tinyrl import rundir
from tinyrl.errors import TinyRLError

ENV = {**os.environ, "COLUMNS": "200"}


def command(data: Path, out: Path, *extra: str, sets: tuple[str, ...] = (), verb: str = "train") -> list[str]:
    base = [f"data.train_path={data}", "trainer.train_batch_size=4", "actor.ppo_mini_batch_size=4",
            "rollout.max_response_length=8", "trainer.save_every=1", "trainer.test_every=0",
            "trainer.device=cpu", *sets]
    args = [sys.executable, "-m", "tinyrl.cli", verb, "--preset", "countdown-tiny", "--out", str(out),
            "--no-dashboard", *extra]
    for item in base:
        args += ["--set", item]
    return args


def run(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args, **kw), capture_output=True, text=True, timeout=600, env=ENV)


@pytest.fixture(scope="module")
def data(countdown_train):
    return countdown_train(64)


def _lock_holder(out: Path) -> str:
    path = out / rundir.LOCK_FILE
    return path.read_text().split(" ")[0] if path.exists() else ""


def test_second_process_is_refused_and_a_sigkill_frees_the_directory(tmp_path, data, tiny_model_dir):
    gate = tmp_path / "gate"
    reward = tmp_path / "gated.py"  # holds the first run inside step 1 until the test opens the gate
    reward.write_text(textwrap.dedent(f"""
        import os, time
        def gated(completion, example):
            while not os.path.exists({str(gate)!r}):
                time.sleep(0.05)
            return 0.5
    """))
    out = tmp_path / "run"
    first = subprocess.Popen(command(data, out, "--max-steps", "1",
                                     sets=(f"reward.fn={reward}:gated", "reward.timeout_s=600")),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 300
        while _lock_holder(out) != str(first.pid):  # written once the lock is held
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first run never took the lock"
            time.sleep(0.05)
        config_before = (out / "config.json").read_text() if (out / "config.json").exists() else None
        second = run(data, out, "--max-steps", "1", sets=("trainer.seed=7",))
        err = " ".join(second.stderr.replace("│", " ").split())
        assert second.returncode == 2, second.stderr[-3000:]
        assert f"pid {first.pid}" in err and "in use by another tinyrl process" in err and "Traceback" not in err
        # the same run-directory code; countdown-tiny made an SFT config as a user's own would be
        sft = run(data, out, "--max-steps", "1", verb="sft", sets=("command=sft",))
        assert sft.returncode == 2 and f"pid {first.pid}" in " ".join(sft.stderr.replace("│", " ").split()), sft.stderr[-3000:]
        if config_before is not None:  # the refused runs wrote nothing
            assert (out / "config.json").read_text() == config_before
        assert not (out / "metrics.jsonl").exists() or all(
            json.loads(line)["step"] == 1 for line in (out / "metrics.jsonl").read_text().splitlines())
        # SIGKILL: no handler runs, the OS drops the lock with the process
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        with rundir.claim(out):  # this process (not the killed one) now owns it
            assert _lock_holder(out) == str(os.getpid())
    finally:
        gate.touch()  # the reward worker the killed run left waits on it: let it end
        if first.poll() is None:
            first.kill()
            first.wait()


def test_foreign_checkpoints_are_refused_and_own_resume_continues(tmp_path, data, tiny_model_dir):
    old, other = tmp_path / "old", tmp_path / "other"
    done = run(data, old, "--max-steps", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    done = run(data, other, "--max-steps", "1", sets=("trainer.seed=3",))
    assert done.returncode == 0, done.stderr[-3000:]
    old_id, other_id = (json.loads((d / rundir.RUN_FILE).read_text())["run_id"] for d in (old, other))
    assert old_id != other_id
    assert json.loads((old / "checkpoints" / "step_0000002" / "meta.json").read_text())["run_id"] == old_id

    # a finished run met again by a new one (no --resume): refused, said what it holds and how to use it
    kept = {p: p.read_bytes() for p in old.rglob("*") if p.is_file() and p.name != rundir.LOCK_FILE}
    again = run(data, old, "--max-steps", "2")
    err = " ".join(again.stderr.replace("│", " ").split())
    assert again.returncode == 2 and f"{old} already holds a run (metrics.jsonl; its last checkpoint is step 2)" \
        in err and f"--set model.init_from={old}" in err, err[-3000:]
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file() and p.name != rundir.LOCK_FILE} == kept

    # issue 29 item 2: metrics.jsonl deleted, a new run (other settings, save_every=1) started there
    (old / "metrics.jsonl").unlink()
    kept = {p: p.read_bytes() for p in old.rglob("*") if p.is_file() and p.name != rundir.LOCK_FILE}
    new = run(data, old, "--max-steps", "2", sets=("trainer.seed=5",))
    err = " ".join(new.stderr.replace("│", " ").split())
    assert new.returncode == 2 and "holds checkpoints this new run did not write (step 1, 2)" in err, err[-3000:]
    assert "--resume" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file() and p.name != rundir.LOCK_FILE} == kept

    # another run's real checkpoint copied into a run directory: --resume names both runs
    shutil.copytree(old / "checkpoints" / "step_0000002", other / "checkpoints" / "step_0000002")
    resumed = run(data, other, "--resume", "--max-steps", "3", sets=("trainer.seed=3",))
    err = " ".join(resumed.stderr.replace("│", " ").split())
    assert resumed.returncode == 2, err[-3000:]
    assert f"step_0000002 (run {old_id})" in err and f"this directory's run is {other_id}" in err
    assert not (other / "checkpoints" / "step_0000003").exists()

    # checkpoints/ copied alone into a new directory: the new run said "add --resume", and
    # --resume then said "run without --resume to start one", each sending the user to the other
    lone = tmp_path / "lone"
    shutil.copytree(old / "checkpoints", lone / "checkpoints")
    for extra in ((), ("--resume",)):
        refused = run(data, lone, "--max-steps", "3", *extra)
        err = " ".join(refused.stderr.replace("│", " ").split())
        assert refused.returncode == 2 and "no run's config.json is beside them" in err, err[-3000:]
        assert "add --resume" not in err and "run without --resume" not in err and f"{lone / 'checkpoints'}" in err
    assert not (lone / "config.json").exists()

    # the run's own checkpoints resume as before
    resumed = run(data, old, "--resume", "--max-steps", "3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 2" in resumed.stdout + resumed.stderr
    assert json.loads((old / "checkpoints" / "step_0000003" / "meta.json").read_text())["run_id"] == old_id


# ------------------------------------------------------------------ a reward that breaks the run (item 5)


def test_user_rewards_that_break_the_run_stop_it_loudly(tmp_path, data, tiny_model_dir):
    """A user's reward file over a user's parquet: 1e308 (was: every optimizer step skipped,
    "run finished", exit 0) and os._exit(0) after the first checkpoint (was: exit 0, no output)
    each stop the run with exit 2 naming the function; the checkpoint on disk stays good."""
    rewards = tmp_path / "rewards.py"
    out = tmp_path / "run"
    rewards.write_text(textwrap.dedent(f"""
        import os
        def huge(completion, example):
            return 1e308
        def quits(completion, example):
            if os.path.exists({str(out / 'checkpoints' / 'step_0000001')!r}):
                os._exit(0)
            return 0.5
        def raises(completion, example):
            raise ValueError("no score for this one")
    """))
    huge = run(data, tmp_path / "huge", "--max-steps", "2", sets=(f"reward.fn={rewards}:huge",))
    err = " ".join(huge.stderr.replace("│", " ").split())
    assert huge.returncode == 2 and f"{rewards}:huge" in err and "beyond the bound" in err, err[-3000:]
    assert "run finished" not in huge.stdout and "Traceback" not in err
    assert f"(the row is in {data})" in err  # "row index 3294 (train)": of which file

    raises = run(data, tmp_path / "raises", "--max-steps", "1", sets=(f"reward.fn={rewards}:raises",))
    err = " ".join(raises.stderr.replace("│", " ").split())
    assert raises.returncode == 2 and f"{rewards}:raises on row index " in err, err[-3000:]
    assert "raised ValueError: no score for this one" in err and f"(the row is in {data})" in err

    quits = run(data, out, "--max-steps", "3", sets=(f"reward.fn={rewards}:quits",))
    err = " ".join(quits.stderr.replace("│", " ").split())
    assert quits.returncode == 2, (quits.returncode, err[-3000:])
    assert f"{rewards}:quits" in err and "ended its worker process without returning" in err and "exit code 0" in err
    assert f"(the row is in {data})" in err
    assert "run finished" not in quits.stdout
    from tinyrl import checkpoint as ckpt

    assert [ckpt.step_of(p) for p in ckpt.list_checkpoints(out / "checkpoints")] == [1]
    assert ckpt.load_latest(out / "checkpoints")["step"] == 1  # whole and loadable: --resume goes on from it


def test_a_reward_that_raises_mid_run_prints_the_command_that_continues_that_run(tmp_path, data, tiny_model_dir):
    """A user's reward that raised at step 2 said "fix it" and nothing of resuming (one that ended
    its worker said a bare `--resume`); `train --out RUN --resume` alone drops the start's
    --max-steps (run.json restores --preset and --set only) and ran on to the preset's 40 steps.
    The hint now holds the whole command; followed as printed, the run ends at step 3."""
    import shlex

    rewards, out = tmp_path / "rewards.py", tmp_path / "run"
    rewards.write_text(f"import os\ndef score(completion, example):\n"
                       f"    if os.path.exists({str(out / 'checkpoints' / 'step_0000001')!r}):\n"
                       f"        raise ValueError('no score for this one')\n    return 0.5\n")
    stopped = run(data, out, "--max-steps", "3", sets=(f"reward.fn={rewards}:score",))
    err = " ".join(stopped.stderr.replace("│", " ").split())
    assert stopped.returncode == 2 and "raised ValueError: no score for this one" in err, err[-3000:]
    kept = json.loads((out / rundir.RUN_FILE).read_text())["resume"]  # the run's own resume command
    assert "--max-steps 3" in kept and f"then continue the run from its checkpoint of step 1 with: {kept}" in err, err
    rewards.write_text("def score(completion, example):\n    return 0.5\n")  # fixed
    again = shlex.split(err.split("with: ")[-1].split(" ╰")[0])
    assert again[:2] == ["tinyrl", "train"], again
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", *again[1:], "--no-dashboard"], capture_output=True,
                          text=True, timeout=600, env=ENV)
    assert done.returncode == 0 and "run finished at step 3" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_demos_sft_run_met_again_names_the_presets_that_start_from_it(tmp_path, monkeypatch):
    """README's first command run a second time: `tinyrl sft --preset countdown-demo-sft` into its
    finished run was told "--set model.init_from=runs/countdown-demo-sft (the demo presets name
    their SFT run already)"; the same words were said of the RL demo's own run, which no preset
    starts from. Now the presets that start from it are named, as commands."""
    monkeypatch.chdir(tmp_path)
    sft = tmp_path / "runs" / "countdown-demo-sft"
    sft.mkdir(parents=True)
    (sft / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(TinyRLError) as refused:
        rundir.check_new_run(Path("runs/countdown-demo-sft"))
    hint = refused.value.hint
    assert "`tinyrl train --preset countdown-demo`" in hint and "`tinyrl train --preset countdown-demo-ppo`" in hint
    assert "`tinyrl sft --preset countdown-tools-demo-sft`" in hint and "--set model.init_from" not in hint
    rl = tmp_path / "runs" / "countdown-demo"
    rl.mkdir()
    (rl / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(TinyRLError) as refused:
        rundir.check_new_run(Path("runs/countdown-demo"))
    assert refused.value.hint.startswith("to train from it as it is: --set model.init_from=runs/countdown-demo;")


def test_a_new_run_never_writes_over_a_model_directory_or_the_users_files(tmp_path, data, tiny_model_dir):
    """`train --out DIR` wrote its config.json over an exported model's (no loader read it after)
    and appended to a timeline.jsonl of the user's: only metrics.jsonl and checkpoints/ were looked
    at. A directory holding a file a run writes, and not a tinyrl run's, is refused before loading."""
    export = tmp_path / "exported"
    shutil.copytree(tiny_model_dir, export)  # a Hugging Face model directory: config.json, weights
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "timeline.jsonl").write_text("my own lines\n")
    for out, named in ((export, "config.json"), (mine, "timeline.jsonl")):
        kept = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        done = run(data, out, "--max-steps", "1")
        err = " ".join(done.stderr.replace("│", " ").split())
        assert done.returncode == 2 and f"{out} holds {named}, which a run writes over, and is not a tinyrl run" \
            in err and "nothing was changed" in err, err[-3000:]
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == kept  # no lock file left either
    # a run that stopped before its first step (its own config.json, no metrics): started again there
    started = tmp_path / "started"
    started.mkdir()
    (started / "config.json").write_text(json.dumps({"preset": "countdown-tiny", "trainer": {}}))
    rundir.check_new_run(started)


def test_resume_needs_only_the_run_directory(tmp_path, data, tiny_model_dir):
    """After a kill -9 nothing printed the resume command, and `train --out RUN --resume` said
    "Missing option '--preset'": every --set of the start had to be typed again. run.json keeps
    the command; --resume without --preset reads it (a --set given now replaces the kept one)."""
    out = tmp_path / "run"
    done = run(data, out, "--max-steps", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    kept = json.loads((out / rundir.RUN_FILE).read_text())["resume"]
    assert kept.startswith("tinyrl train --preset countdown-tiny --out ") and f"--set data.train_path={data}" in kept
    bare = [sys.executable, "-m", "tinyrl.cli", "train", "--out", str(out), "--resume", "--max-steps", "2",
            "--no-dashboard", "--set", "trainer.log_samples=1"]
    done = subprocess.run(bare, capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["run/process_step"]) for m in lines] == [(1, 1), (2, 1)]  # each process's first step
    assert json.loads((out / "config.json").read_text())["data"]["train_path"] == str(data)
    # the resume's own command is kept now: it kept the start's `--max-steps 1`, which after a
    # kill -9 of this resume "ended at once (nothing was trained)"
    kept = json.loads((out / rundir.RUN_FILE).read_text())["resume"]
    assert "--max-steps 2" in kept and "--set trainer.log_samples=1" in kept and f"--set data.train_path={data}" in kept
    # no --preset: a new run, or a run that keeps no command, is one screen, exit 2; a mistyped
    # --out with no run at all is said as such (it said "keeps no command to continue it" and
    # "NONE/config.json holds its settings", of a directory that did not exist)
    older = tmp_path / "older"  # a run started before run.json kept the command
    older.mkdir()
    (older / "config.json").write_text((out / "config.json").read_text())
    for args, said in ((["train", "--out", str(tmp_path / "new")], "--preset is needed"),
                       (["sft", "--out", str(older), "--resume"], "keeps no command to continue it"),
                       (["train", "--out", str(tmp_path / "none"), "--resume"], "holds no run (no such directory)"),
                       (["train", "--out", str(tmp_path), "--resume"], "holds no run (no config.json)")):
        refused = subprocess.run([sys.executable, "-m", "tinyrl.cli", *args], capture_output=True, text=True,
                                 timeout=300, env=ENV)
        assert refused.returncode == 2 and said in " ".join(refused.stderr.split()) and "Traceback" not in \
            refused.stderr, refused.stderr
        assert "holds no run" not in said or "--preset is needed" not in refused.stderr, refused.stderr
    assert not (tmp_path / "none").exists()


def test_a_run_stopped_by_bad_input_leaves_no_empty_directory_and_keeps_the_users(tmp_path):
    """`tinyrl sft --out runs/e6 --set data.train_path=mydata.jsonl` stopped with a good message,
    exit 2, and left runs/e6/ holding only .tinyrl.lock. A directory the user made stays."""
    (tmp_path / "mydata.jsonl").write_text('{"prompt": "1 + 1", "response": "2"}\n')
    made, mine = tmp_path / "runs" / "e6", tmp_path / "mine"
    mine.mkdir()
    for out in (made, mine):
        done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "sft", "--preset", "countdown-tiny-sft",
                               "--out", str(out), "--set", f"data.train_path={tmp_path / 'mydata.jsonl'}"],
                              capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path)
        assert done.returncode == 2 and ".jsonl" in done.stderr, done.stderr[-2000:]
    assert not made.exists() and mine.is_dir()
    with rundir.claim(made):  # a claim whose command wrote something keeps its directory
        (made / "config.json").write_text("{}")
    assert (made / "config.json").exists()


def test_a_start_stopped_at_the_users_reward_leaves_nothing(tmp_path):
    """`--out runs/y --set reward.fn=imp.py:score` with an import error or a function of the
    wrong shape stopped with exit 2 and left runs/y/ holding .tinyrl.lock and an empty
    reward_prints.log, opened before the function loaded (then kept, as not the lock's alone),
    and runs/ above it. The prints file is opened once the function has loaded; the claim removes
    the folders it made."""
    (tmp_path / "imp.py").write_text("print('importing imp')\nimport nonexistent_mod\n"
                                     "def score(completion, example):\n    return 1.0\n")
    (tmp_path / "arity.py").write_text("def score(x):\n    return 1.0\n")
    for spec, said in (("imp.py:score", "nonexistent_mod"), ("arity.py:score", "arity.py:score")):
        done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "train", "--preset", "countdown-tiny",
                               "--out", "runs/y", "--no-dashboard", "--set", f"reward.fn={spec}"],
                              capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path)
        assert done.returncode == 2 and said in done.stderr, done.stderr[-2000:]
        assert not (tmp_path / "runs").exists(), sorted(str(p) for p in (tmp_path / "runs").rglob("*"))
        if spec.startswith("imp"):  # what the module printed before it failed: shown, not in a file
            assert "importing imp" in done.stderr
    # a reward that loaded, then an input check that stopped the start: its prints file was opened
    # (empty) and kept runs/y/ beside the lock until 2026-11-28; the generated data stays, for reuse
    (tmp_path / "ok.py").write_text("def score(completion, example):\n    return 1.0\n")
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "train", "--preset", "countdown-tiny", "--out", "runs/y",
                           "--no-dashboard", "--set", "reward.fn=ok.py:score", "--set", "data.max_prompt_length=8"],
                          capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path)
    assert done.returncode == 2 and "data.max_prompt_length = 8" in " ".join(done.stderr.split()), done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["data"]


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every entry under root, hidden ones too: a file's bytes, None for a directory."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def test_a_refused_out_leaves_the_users_directory_exactly_as_it_was(tmp_path, monkeypatch, capsys, data):
    """A `train`/`sft` that refuses --out (a directory of the user's holding another run, a
    model's or the user's own files, checkpoints copied alone; a bad input found after the claim)
    said "nothing was changed" and left a .tinyrl.lock there. Now the tree is as it was, byte
    for byte, hidden files included; a directory it would have made is not made."""
    from test_safety import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.py").write_text("def score(completion, example):\n    return 1.0\n")
    sets = ["--set", f"data.train_path={data}", "--set", "trainer.device=cpu"]
    mine = {"model": {"config.json": '{"model_type": "qwen2"}', "notes.txt": "mine"},
            "other-run": {"metrics.jsonl": '{"step": 1}\n', ".hidden": "x"},
            "copied": {"checkpoints/step_0000002/state.pt": "x", "checkpoints/step_0000002/meta.json": "{}"},
            "empty": {}, "file-out": None}
    for name, files in mine.items():
        if files is None:
            (tmp_path / name).write_text("a file, not a directory")
            continue
        (tmp_path / name).mkdir()
        for rel, text in files.items():
            (tmp_path / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / rel).write_text(text)
    before = _tree(tmp_path)
    for verb, out, extra, said in (
            ("train", "model", [], "holds config.json, which a run writes over"),
            ("sft", "other-run", [], "already holds a run"),
            ("train", "copied", [], "holds checkpoints this new run did not write"),
            ("train", "empty", ["--resume"], "holds no run (no config.json)"),
            ("train", "file-out", [], "is a file, not a directory"),
            # found after the claim, with the reward loaded (its empty prints file opened)
            ("train", "empty", ["--set", "reward.fn=ok.py:score", "--set", "data.max_prompt_length=8"],
             "data.max_prompt_length = 8"),
            ("train", "runs/new", ["--set", "reward.fn=ok.py:score", "--set", "data.max_prompt_length=8"],
             "data.max_prompt_length = 8")):
        preset = "countdown-tiny-sft" if verb == "sft" else "countdown-tiny"
        code, err = cli(monkeypatch, capsys, verb, "--preset", preset, "--out", out, "--no-dashboard",
                        "--max-steps", "1", *(sets if verb == "train" else []), *extra)  # a missed refusal: 1 step
        assert code == 2 and said in err and "Traceback" not in err, (out, extra, err[-2000:])
        assert _tree(tmp_path) == before, (out, extra, set(_tree(tmp_path)) ^ set(before))


def test_a_start_refused_for_want_of_a_card_leaves_nothing(tmp_path):
    """`tinyrl sft --preset retool-sft-4090` on a machine whose torch sees no card stopped at the
    CUDA check (exit 2) and left an empty runs/ in the working directory (the default --out
    runs/NAME: its run directory was removed, the folder above it not)."""
    env = {**ENV, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}  # the refusal on any machine
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "sft", "--preset", "retool-sft-4090"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 2 and "sees no CUDA card" in " ".join(done.stderr.split()), done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_a_held_lock_is_seen_where_proc_locks_names_another_device(tmp_path, monkeypatch):
    """On btrfs subvolumes (and overlay mounts) stat's device is not the one /proc/locks prints, so a
    held run directory read as free: `eval`/`export` on a run still starting said "not a run
    directory", `report` called a live run stopped. Simulated: the real /proc/locks with every
    device number changed, as btrfs shows it; the lock itself is real, held by another process."""
    import re

    run = tmp_path / "run"
    holder = hold_run_lock(run)
    try:
        assert rundir.other_holder(run).startswith(f"{holder.pid} tinyrl train since ")
        elsewhere = re.sub(r" [0-9a-f]+:[0-9a-f]+:(\d+) ", r" 00:99:\1 ", rundir.proc_locks())
        assert elsewhere != rundir.proc_locks()
        monkeypatch.setattr(rundir, "proc_locks", lambda: elsewhere)
        assert rundir.other_holder(run).startswith(f"{holder.pid} tinyrl train since ")
        with pytest.raises(TinyRLError, match="still starting"):
            raise rundir.starting_run(run)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert rundir.other_holder(run) is None  # ended (it wrote nothing there, so it left nothing)
    run.mkdir(exist_ok=True)
    (run / rundir.LOCK_FILE).write_text(f"{holder.pid} tinyrl train since 2026-01-02 03:04:05")
    assert rundir.other_holder(run) is None  # a lock file outlives its run; that pid is gone
    (run / rundir.LOCK_FILE).write_text(f"{os.getpid()} tinyrl train since 2026-01-02 03:04:05")
    assert rundir.other_holder(run) is None  # a live pid (reused) that holds no lock on it
