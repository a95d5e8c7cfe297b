"""Nothing lost (issue 11): user data, changed configs on resume, hostile reward code, export's
--out, one-screen errors, torn log lines, a full disk while logging. Fast: the CLI is called
in-process for errors that stop before a model loads; the fault suite (test_faults.py) runs the
real CLI under real signals."""

from __future__ import annotations

import json
import math
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import torch

from helpers import small_disk
from tinyrl import config as config_mod
from tinyrl.config import files as config_files  # where resolve_path reads the checkout
from tinyrl import jsonl
from tinyrl.config import Config, load_config
from tinyrl.errors import TinyRLError
from tinyrl.rewards.registry import load_reward_fn

REPO = Path(__file__).resolve().parent.parent


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """tinyrl ARGS in this process: (exit code, stderr)."""
    from tinyrl import cli as cli_mod

    monkeypatch.setattr(sys, "argv", ["tinyrl", *args])
    monkeypatch.setenv("COLUMNS", "200")
    try:
        cli_mod.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, unboxed(capsys.readouterr().err)


def unboxed(err: str) -> str:
    """The error panel's text as one line: its side borders dropped, so a phrase the panel wrapped
    (where depends on the temporary path's length) reads as printed: "--out │ │ DIR" is "--out DIR"."""
    return " ".join(" ".join(line.strip().strip("│") for line in err.splitlines()).split())


# ------------------------------------------------------------------ 1. a mistyped data path


def test_mistyped_train_path_is_an_error_and_touches_nothing(tmp_path, monkeypatch, capsys, countdown_train):
    data = tmp_path / "mydata"
    data.mkdir()
    (data / "train.parquet").write_bytes(countdown_train(64).read_bytes())
    (data / "test.parquet").write_bytes(b"the user's own test file")
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    code, err = cli(monkeypatch, capsys, "train", "--preset", "countdown-tiny", "--out", str(tmp_path / "run"),
                    "--no-dashboard", "--set", f"data.train_path={data}/trian.parquet")
    assert code == 2 and "file not found" in err and "did you mean" in err and "train.parquet" in err
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before  # nothing generated, renamed or overwritten
    assert not (tmp_path / "run").exists()


def test_preset_default_path_is_generated_without_overwriting(tmp_path, monkeypatch):
    from tinyrl.setup import ensure_train_data

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(config_files, "REPO_ROOT", tmp_path / "no-repo")  # not the repo's own runs/
    cfg = load_config("countdown-tiny", ["data.generate_train_size=64", "trainer.test_every=0"])
    target = tmp_path / cfg.data.train_path
    target.parent.mkdir(parents=True)
    (target.parent / "test.parquet").write_bytes(b"keep me")
    path = ensure_train_data(cfg)
    assert path == Path(cfg.data.train_path) and len(pd.read_parquet(target)) == 64
    assert (target.parent / "test.parquet").read_bytes() == b"keep me"
    # no temp dir left; the record of the settings that made it (not of the test file, which it kept)
    assert sorted(p.name for p in target.parent.iterdir()) == ["test.parquet", "train.parquet", "train.settings.json"]
    assert json.loads((target.parent / "train.settings.json").read_text())["test_file"] is None
    mtime = target.stat().st_mtime_ns
    ensure_train_data(cfg)  # present: used as it is
    assert target.stat().st_mtime_ns == mtime


# ------------------------------------------------------------------ 4. config changes on resume


def _run_dir_with_config(tmp_path: Path, *overrides: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(load_config("countdown-tiny", list(overrides)).to_dict()))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    return run


def test_resume_refuses_settings_that_cannot_change(tmp_path, monkeypatch, capsys, countdown_train):
    data = f"data.train_path={countdown_train(64)}"
    run = _run_dir_with_config(tmp_path, data)
    code, err = cli(monkeypatch, capsys, "train", "--preset", "countdown-tiny", "--out", str(run), "--resume",
                    "--no-dashboard", "--set", data, "--set", "trainer.train_batch_size=16",
                    "--set", "model.lora_rank=4", "--set", "trainer.max_steps=9")
    assert code == 2 and "Traceback" not in err
    assert "trainer.train_batch_size: 32 -> 16" in err and "model.lora_rank: 8 -> 4" in err
    assert "trainer.max_steps: 40" not in err  # may change: not among the problems
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_a_resume_with_preset_that_drops_the_kept_sets_names_the_command_that_keeps_them(tmp_path):
    """A walk: `tinyrl train --preset countdown-tiny --resume` of a run started with --set
    options refused each as a change and said only "resume with the run's own settings (its
    config.json)", while `--out RUN --resume` without --preset reads them from run.json."""
    from tinyrl import rundir
    from tinyrl.resume_check import check_resume

    run = _run_dir_with_config(tmp_path, "trainer.train_batch_size=16")
    (run / rundir.RUN_FILE).write_text(json.dumps({
        "run_id": "abc", "cwd": str(tmp_path),
        "resume": f"tinyrl train --preset countdown-tiny --out {run} --resume --max-steps 3 "
                  "--set trainer.train_batch_size=16"}))
    with pytest.raises(TinyRLError) as refused:
        check_resume(run, load_config("countdown-tiny"))
    assert "trainer.train_batch_size: 16 -> 32" in refused.value.message
    assert f"`tinyrl train --out {run} --resume`" in refused.value.hint and "--max-steps 3" not in refused.value.hint
    (run / rundir.RUN_FILE).unlink()  # a run from before run.json kept its command: its config.json
    with pytest.raises(TinyRLError) as refused:
        check_resume(run, load_config("countdown-tiny"))
    assert "resume with the run's own settings (its config.json)" in refused.value.hint


def test_resume_lists_settings_that_may_change():
    from tinyrl.resume_check import compare

    saved = load_config("countdown-tiny").to_dict()
    now = load_config("countdown-tiny", ["trainer.max_steps=80", "trainer.save_every=5", "actor.lr=1e-3"]).to_dict()
    forbidden, allowed = compare(saved, now)
    assert forbidden == ["actor.lr: 0.002 -> 0.001"]  # the scheduler state would override it silently
    assert allowed == ["trainer.max_steps: 40 -> 80", "trainer.save_every: 10 -> 5"]
    del saved["reward"]["timeout_s"]  # a config written before the key existed: its default
    assert compare(saved, load_config("countdown-tiny").to_dict()) == ([], [])
    # an SFT run from before `command` existed: its file cannot say it was one, so it is not "train"
    sft = load_config("countdown-tiny-sft").to_dict()
    assert compare({k: v for k, v in sft.items() if k != "command"}, sft) == ([], [])
    rl = load_config("countdown-tiny").to_dict()
    assert compare(sft, {**sft, "command": "train"})[0] == ['command: "sft" -> "train"']
    assert compare(rl, {**rl, "command": "sft"})[0] == ['command: "train" -> "sft"']


def test_resume_on_another_machine_may_change_how_many_tool_calls_run_at_once():
    """rollout.tool_workers is the machine's (0 = its cores); the printed resume command repeats
    a --set of it, which a machine with fewer cores could not change."""
    from tinyrl.resume_check import compare

    saved = load_config("countdown-tools-demo", ["rollout.tool_workers=4"], check=False).to_dict()
    now = load_config("countdown-tools-demo", ["rollout.tool_workers=1"], check=False).to_dict()
    assert compare(saved, now) == ([], ["rollout.tool_workers: 4 -> 1"])
    changed = load_config("countdown-tools-demo", ["rollout.tool_workers=1", "rollout.tool_timeout_s=2"], check=False).to_dict()
    assert compare(saved, changed)[0] == ["rollout.tool_timeout_s: 10.0 -> 2.0"]  # an episode's outcome: kept


# ------------------------------------------------------------------ 6. hostile reward code


def _reward(tmp_path, body: str, timeout_s: float = 60.0):
    path = tmp_path / "hostile.py"
    path.write_text(textwrap.dedent(body))
    return load_reward_fn(f"{path}:score", timeout_s=timeout_s)


EXAMPLE = {"reward_model": {"ground_truth": {"target": 3}}, "extra_info": {"index": 17, "split": "train"}}


def test_endless_reward_hits_the_time_limit_naming_function_and_sample(tmp_path):
    fn = _reward(tmp_path, """
        def score(completion, example):
            while True:
                pass
    """, timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(TinyRLError) as info:
        fn("my answer", EXAMPLE)
    # SIGALRM fires after 0.5 s of wall time whatever the load; the handler runs at the loop's
    # next bytecode, so load adds scheduling delay (ms), not 3x. 5 s: 4.5 s of slack; and a
    # missing limit never gets here (faulthandler ends the process at 0.5 + 2 s).
    assert time.monotonic() - started < 5
    msg = str(info.value)
    assert "hostile.py:score" in msg and "row index 17" in msg and "'my answer'" in msg
    assert "reward.timeout_s = 0.5" in msg


def test_reward_that_swallows_the_alarm_is_still_late(tmp_path):
    # In-process, so faulthandler's watchdog (limit 0.3 s + grace 2 s = 2.3 s) would end pytest
    # itself if the call ran that long. The loop stops at 0.5 s of wall time (late by 0.2 s on
    # any machine: the check is on the clock, not on work done), leaving 1.8 s for one
    # time.sleep(0.05) to oversleep on a loaded machine (was 1.0 s: 1.3 s left).
    fn = _reward(tmp_path, """
        import time
        def score(completion, example):
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                try:
                    time.sleep(0.05)
                except BaseException:
                    pass
            return 1.0
    """, timeout_s=0.3)
    with pytest.raises(TinyRLError, match="did not return within"):
        fn("x", EXAMPLE)


@pytest.mark.parametrize("body,kind", [("import sys; sys.exit(0)", "SystemExit"),
                                       ("raise KeyboardInterrupt", "KeyboardInterrupt")])
def test_exits_inside_a_reward_are_its_errors(tmp_path, body, kind):
    fn = _reward(tmp_path, f"""
        def score(completion, example):
            {body}
    """)
    with pytest.raises(TinyRLError, match=f"raised {kind}"):
        fn("x", EXAMPLE)


@pytest.mark.parametrize("value", ["True", "'1.0'", "None", "float('nan')"])
def test_non_numeric_rewards_are_rejected(tmp_path, value):
    fn = _reward(tmp_path, f"""
        def score(completion, example):
            return {value}
    """)
    with pytest.raises(TinyRLError, match="not a finite number"):
        fn("x", EXAMPLE)
    assert _reward(tmp_path, "def score(c, e):\n    return 1\n")("x", EXAMPLE) == 1.0


def test_reward_stuck_in_c_code_ends_its_worker_with_the_message(tmp_path, capfd):
    # One C loop never returns to Python: faulthandler's watchdog ends the reward's worker
    # process (tinyrl.rewards.worker), not this one, and the caller gets the function's error.
    fn = _reward(tmp_path, """
        def score(completion, example):
            return float(sum(range(10**13)))
    """, timeout_s=0.5)
    with pytest.raises(TinyRLError, match="did not return within reward.timeout_s = 0.5") as info:
        fn("x", EXAMPLE)
    assert "hostile.py:score" in str(info.value) and "row index 17" in str(info.value)
    dump = capfd.readouterr().err  # the worker's stack dump: where the user's code was stuck
    assert "Timeout" in dump and "hostile.py" in dump and "in score" in dump


@pytest.mark.parametrize("body,code", [("import os; os._exit(0)", "exit code 0"),
                                       ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "SIGKILL")])
def test_reward_that_ends_its_process_is_an_error(tmp_path, body, code):
    # Issue 29: os._exit(0) inside a reward ended `tinyrl train` with exit 0, no output.
    fn = _reward(tmp_path, f"""
        def score(completion, example):
            {body}
    """)
    with pytest.raises(TinyRLError, match="ended its worker process without returning") as info:
        fn("my answer", EXAMPLE)
    assert "hostile.py:score" in str(info.value) and code in str(info.value) and "row index 17" in str(info.value)
    with pytest.raises(TinyRLError, match="ended its worker process"):  # a fresh worker, the same verdict
        fn("x", EXAMPLE)


def test_reward_keeps_its_state_between_calls(tmp_path):
    fn = _reward(tmp_path, """
        calls = []
        def score(completion, example):
            calls.append(completion)
            return float(len(calls))
    """)
    assert [fn("x", EXAMPLE) for _ in range(3)] == [1.0, 2.0, 3.0]  # one worker, its module imported once


@pytest.mark.parametrize("value", ["1e308", "-2e6", "float('inf')"])
def test_absurd_rewards_are_rejected(tmp_path, value):
    fn = _reward(tmp_path, f"""
        def score(completion, example):
            return {value}
    """)
    with pytest.raises(TinyRLError, match=r"hostile.py:score") as info:
        fn("x", EXAMPLE)
    assert "not a finite number" in str(info.value) or "beyond the bound of +-1e+06" in str(info.value)
    assert _reward(tmp_path, "def score(c, e):\n    return -1e6\n")("x", EXAMPLE) == -1e6  # the bound itself is allowed


# ------------------------------------------------------------------ 7. export --out


def test_export_never_writes_into_the_run_or_a_full_directory(tmp_path, monkeypatch, capsys):
    run = _run_dir_with_config(tmp_path)
    config_before = (run / "config.json").read_text()
    code, err = cli(monkeypatch, capsys, "export", str(run), "--out", str(run))
    assert code == 2 and "is the run directory itself" in err
    code, err = cli(monkeypatch, capsys, "export", str(run), "--out", str(run), "--overwrite")
    assert code == 2 and "is the run directory itself" in err
    assert (run / "config.json").read_text() == config_before
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    code, err = cli(monkeypatch, capsys, "export", str(run), "--out", str(full))
    assert code == 2 and "not empty" in err and "--overwrite" in err
    assert (full / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------ 8. one-screen errors


@pytest.mark.parametrize("setting,expect", [("actor.lr=-1", "actor.lr = -1.0 must be > 0"),
                                            ("actor.lr=nan", "actor.lr = nan is not a finite number"),
                                            ("critic.lr=inf", "critic.lr = inf is not a finite number"),
                                            ("data.max_test_prompts=0", "data.max_test_prompts = 0 must be at least 1")])
def test_bad_numbers_are_caught_before_loading(monkeypatch, capsys, setting, expect, tmp_path):
    code, err = cli(monkeypatch, capsys, "train", "--preset", "countdown-tiny", "--set", setting,
                    "--out", str(tmp_path / "run"))
    assert code == 2 and expect in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # stopped before anything was loaded or written


def test_preset_paths_that_are_not_presets(tmp_path, monkeypatch, capsys):
    binary = tmp_path / "model.toml"
    binary.write_bytes(bytes(range(256)) * 4)
    code, err = cli(monkeypatch, capsys, "presets", "show", str(binary))
    assert code == 2 and "is not text" in err
    code, err = cli(monkeypatch, capsys, "presets", "show", str(tmp_path))
    assert code == 2 and "is a directory" in err
    code, err = cli(monkeypatch, capsys, "presets", "show", "nothere.toml")
    assert code == 2 and "file not found" in err and "unknown preset" not in err


def test_a_preset_naming_another_is_refused_and_presets_show_saves_as_a_preset(tmp_path, monkeypatch, capsys):
    # `preset = "countdown-tiny"` ran every other setting at its default, as a run named
    # countdown-tiny (its default --out runs/countdown-tiny): the saved output of `presets show`
    # held that line, so a user's copy of it ran under the shipped preset's name
    mine = tmp_path / "mine.toml"
    mine.write_text('preset = "countdown-tiny"\n[trainer]\nmax_steps = 2\n')
    with pytest.raises(TinyRLError, match="cannot name another preset") as info:
        load_config(str(mine), ["preset=countdown-4090", "trainer.seed=x"])
    assert "in the file" in str(info.value) and "--set preset=countdown-4090" in str(info.value)
    assert "trainer.seed" in str(info.value)  # with the other problems, at once
    from tinyrl.cli.catalog import presets_show

    monkeypatch.setenv("COLUMNS", "200")
    presets_show("countdown-tiny", ["rollout.n=3"], as_json=False)
    mine.write_text(capsys.readouterr().out)
    cfg = load_config(str(mine))
    assert cfg.preset == "mine" and cfg.rollout.n == 3 and cfg.model.lora_rank == 8


def test_a_user_presets_wrong_command_is_answered_with_its_own_path(tmp_path, monkeypatch, capsys):
    # the hint said `tinyrl sft --preset my_sft`: an unknown preset, the file is my_sft.toml
    mine = tmp_path / "my_sft.toml"
    mine.write_text((config_mod.PRESETS_DIR / "countdown-tiny-sft.toml").read_text())
    code, err = cli(monkeypatch, capsys, "train", "--preset", str(mine), "--out", str(tmp_path / "run"))
    assert code == 2 and f"tinyrl sft --preset {mine}`" in err and not (tmp_path / "run").exists()


def test_prompt_errors_name_file_and_row(tmp_path, tok):
    from tinyrl.setup import tokenize_rows

    good = {"role": "user", "content": "fine"}
    path = tmp_path / "prompts.parquet"
    pd.DataFrame({"prompt": [[good], [good], [{"role": "user", "content": None}]],
                  "reward_model": [{"ground_truth": "1"}] * 3}).to_parquet(path)
    with pytest.raises(TinyRLError) as info:
        tokenize_rows(path, tok, 64)
    assert f"{path} row 2" in str(info.value)


def test_a_prompt_too_long_for_the_model_is_not_answered_with_a_length_the_config_refuses(tmp_path, tok):
    # the hint said "set data.max_prompt_length=15001" for the tiny model, which takes 2,048
    from tinyrl.config import prompt_room
    from tinyrl.setup import tokenize_rows

    path = tmp_path / "prompts.parquet"
    pd.DataFrame({"prompt": ["word " * 3000, "fine"], "reward_model": [{"ground_truth": "1"}] * 2}).to_parquet(path)
    cfg = load_config("countdown-tiny", check=False)
    with pytest.raises(TinyRLError, match="longer than data.max_prompt_length") as info:
        tokenize_rows(path, tok, 256, room=prompt_room(cfg))
    assert "at most 2000 tokens (data.max_prompt_length=2000)" in info.value.hint  # 2,048 - 48 response
    assert load_config("countdown-tiny", ["data.max_prompt_length=2000"]).data.max_prompt_length == 2000
    pd.DataFrame({"prompt": ["word " * 30], "reward_model": [{"ground_truth": "1"}]}).to_parquet(path)
    with pytest.raises(TinyRLError, match="longer than data.max_prompt_length") as info:
        tokenize_rows(path, tok, 4, room=prompt_room(cfg))  # a length that fits: asked for as before
    assert "set data.max_prompt_length=" in info.value.hint


def test_countdown_sizes_have_a_sane_upper_bound(tmp_path, monkeypatch, capsys):
    started = time.monotonic()
    code, err = cli(monkeypatch, capsys, "data", "countdown", "--out", str(tmp_path / "d"), "--test-size", "1000000000")
    assert code == 2 and "between 1 and 4,000,000" in err and time.monotonic() - started < 30
    assert not (tmp_path / "d").exists()


# ------------------------------------------------------------------ 9. report on the default install


def test_matplotlib_is_a_default_dependency():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(dep.startswith("matplotlib") for dep in project["dependencies"])


# ------------------------------------------------------------------ 3. torn lines, full disk


def test_readers_drop_a_torn_last_line_and_the_log_repairs_it(tmp_path):
    from tinyrl.runlog import RunLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "rew')  # what a crash mid-write leaves
    notes: list[str] = []
    assert [r["step"] for r in jsonl.read_records(path, notes)] == [1, 2] and notes
    log = RunLog(tmp_path, torch.device("cpu"))  # a resumed run: the torn tail goes first
    log.metrics({"step": 3})
    assert [r["step"] for r in jsonl.read_records(path)] == [1, 2, 3]
    log.truncate_after(2)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


def test_full_disk_while_logging_keeps_lines_and_warns_once(tmpfs):
    from tinyrl.runlog import RunLog

    where = tmpfs(64 * 1024)
    warnings: list[str] = []
    log = RunLog(where, torch.device("cpu"), warn=warnings.append)
    log.metrics({"step": 1, "pad": "x" * 500})
    filler = small_disk.fill(where)
    for step in (2, 3, 4):  # each line needs a new page of the file
        log.metrics({"step": step, "pad": "x" * 5000})  # no exception: training goes on
    assert len(warnings) == 1 and "DISK PROBLEM" in warnings[0]
    assert log.unwritten() == {"metrics.jsonl": 3}
    assert [r["step"] for r in jsonl.read_records(where / "metrics.jsonl")] == [1]  # no torn line
    filler.unlink()
    log.metrics({"step": 5})
    assert [r["step"] for r in jsonl.read_records(where / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    assert log.unwritten() == {}


def test_partial_write_on_a_full_disk_leaves_no_half_line(tmpfs):
    where = tmpfs(64 * 1024)
    path = where / "metrics.jsonl"
    jsonl.append_record(path, {"step": 1})
    small_disk.fill(where, leave_bytes=0)
    with pytest.raises(OSError):
        jsonl.append_record(path, {"step": 2, "pad": "y" * 20_000})  # larger than any free page
    assert path.read_text() == '{"step": 1}\n'


def test_room_a_checkpoint_prunes_goes_to_the_pending_log_lines_first(tmpfs):
    """Disk full after step 2, a save each step: pruning step 1 freed the room the step-3
    checkpoint then took, so the pending lines were never written (a user's run lost steps 3-8 of
    metrics.jsonl, and --resume from step 8 skipped them for good). The lines go first now."""
    from tinyrl import checkpoint as ckpt
    from tinyrl.runlog import RunLog

    where = tmpfs(2 * 2**20)
    warnings: list[str] = []
    log = RunLog(where, torch.device("cpu"), warn=warnings.append)
    state = lambda step: {"step": step, "w": torch.full((100_000,), float(step))}  # ~400 KB
    for step in (1, 2):
        log.metrics({"step": step})
        assert ckpt.save_checkpoint(where / "ckpt", step, state(step), keep_last=2, before_write=log.flush).saved
    filler = small_disk.fill(where)
    log.metrics({"step": 3, "pad": "x" * 5000})  # needs a page the full disk does not have
    assert log.unwritten_steps() == [3] and len(warnings) == 1
    result = ckpt.save_checkpoint(where / "ckpt", 3, state(3), keep_last=2, before_write=log.flush)
    assert not (where / "ckpt" / "step_0000001").exists()  # pruned to make room
    assert [r["step"] for r in jsonl.read_records(where / "metrics.jsonl")] == [1, 2, 3]
    assert log.unwritten() == {} and log.missing_text() == ""
    # the weights came second: saved if they still fit, else step 2's is kept; never step 3's
    # checkpoint without step 3's line
    on_disk = [ckpt.step_of(p) for p in ckpt.list_checkpoints(where / "ckpt")]
    assert on_disk == ([2, 3] if result.saved else [2]), result.message
    filler.unlink()


def test_resume_names_the_steps_metrics_jsonl_has_no_record_of(tmp_path):
    from tinyrl.report import steps_line
    from tinyrl.runlog import RunLog

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (0, 1, 2, 9, 10)))
    log = RunLog(tmp_path, torch.device("cpu"))
    assert log.truncate_after(9) == [3, 4, 5, 6, 7, 8]  # step 10 goes: it will be redone
    assert "metrics.jsonl has no records of steps 3-8" in log.missing_text()
    assert "no record of steps 3-8" in steps_line(jsonl.read_records(path))
    assert RunLog(tmp_path, torch.device("cpu")).truncate_after(2) == []
    assert "no record" not in steps_line(jsonl.read_records(path))


def test_could_not_write_metrics_parquet_is_said_once(tmpfs):
    """README: a disk warning is printed once. A user's full disk printed this one at each of 6
    checkpoints."""
    from tinyrl.runlog import RunLog

    where = tmpfs(256 * 1024)
    warnings: list[str] = []
    log = RunLog(where, torch.device("cpu"), warn=warnings.append)
    for step in (1, 2, 3):
        log.metrics({"step": step, "loss": 0.5})
    filler = small_disk.fill(where)
    for _ in range(3):
        log.write_parquet()  # no exception: metrics.jsonl has the same records
    assert sum("could not write metrics.parquet" in w for w in warnings) == 1
    assert not (where / "metrics.parquet").exists()
    filler.unlink()
    log.write_parquet()
    assert len(pd.read_parquet(where / "metrics.parquet")) == 3


def test_float_settings_are_all_checked_for_nan():
    cfg = Config()
    cfg.algorithm.kl_coef = math.nan
    assert any("algorithm.kl_coef = nan" in p for p in config_mod.problems_of(cfg))
