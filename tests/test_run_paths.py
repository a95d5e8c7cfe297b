"""A run's relative paths start in the directory it was started in (run.json's cwd).

Found by a new user's walk, all with a base model that was a relative local directory
(`tinyrl export`, then `--set model.name=mymodel`), used from another directory: `tinyrl export`
and `tinyrl eval` tried the folder's name as a Hugging Face id (a traceback, exit 1); a new run's
model.init_from on that run said it was "trained on mymodel, but model.name = ../mymodel" and the
suggested `model.name=mymodel` crashed the same way; `--resume` from another directory tried the
Hub, or said model.init_from was "not a run directory", after generating the preset's data there;
and `--resume` of a model.init_from run needed the source run although it reads only its own copy.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from test_safety import cli  # tinyrl ARGS in this process: (exit code, stderr)
from tinyrl.config import load_config
from tinyrl.errors import TinyRLError

TRAIN = ["--preset", "countdown-tiny", "--no-dashboard", "--set", "model.name=mymodel",
         "--set", "trainer.train_batch_size=8", "--set", "actor.ppo_mini_batch_size=8"]


@pytest.fixture
def started(tmp_path, monkeypatch, capsys, tiny_model_dir, countdown_train):
    """(start, run, other): a one-step run trained in `start` on ./mymodel, and another directory."""
    start, other = tmp_path / "start", tmp_path / "other"
    other.mkdir()
    shutil.copytree(tiny_model_dir, start / "mymodel")
    monkeypatch.chdir(start)
    monkeypatch.setattr("test_run_paths.TRAIN", TRAIN + ["--set", f"data.train_path={countdown_train(64)}"])
    code, err = cli(monkeypatch, capsys, "train", *TRAIN, "--out", "run", "--max-steps", "1")
    assert code == 0, err
    monkeypatch.chdir(other)
    return start, start / "run", other


def test_a_run_on_a_relative_local_base_exports_from_elsewhere_and_a_moved_base_is_said(started, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the moved base is tried as a Hub id: no 45 s of retries
    start, run, other = started
    code, err = cli(monkeypatch, capsys, "export", str(run), "--out", "exported")
    assert code == 0 and (other / "exported" / "tinyrl_export.json").is_file(), err
    (start / "mymodel").rename(start / "elsewhere")
    code, err = cli(monkeypatch, capsys, "export", str(run), "--out", "again")
    assert code == 2 and "Traceback" not in err, err
    assert "base model 'mymodel'" in err and f"from {start}, where the run started" in err, err
    assert not (other / "again").exists()


def test_a_resume_from_another_directory_is_sent_to_where_the_run_started(started, monkeypatch, capsys):
    start, run, other = started
    before = sorted(p.name for p in run.rglob("*"))
    code, err = cli(monkeypatch, capsys, "train", *TRAIN, "--out", str(run), "--resume", "--max-steps", "2")
    assert code == 2 and "mymodel" in err and f"cd {start} && tinyrl train --preset countdown-tiny --out run" in err, err
    assert sorted(p.name for p in run.rglob("*")) == before and not list(other.iterdir())  # nothing generated
    monkeypatch.chdir(start)  # as the hint says: there it goes on
    code, err = cli(monkeypatch, capsys, "train", *TRAIN, "--out", "run", "--resume", "--max-steps", "2")
    assert code == 0 and (run / "checkpoints" / "step_0000002").is_dir(), err


def test_init_from_a_run_on_a_relative_base_names_it_as_reached_from_here(started):
    start, run, _ = started
    assert load_config("countdown-tiny", [f"model.init_from={run}", "model.name=../start/mymodel"])
    with pytest.raises(TinyRLError) as refused:  # the run's own string, which means nothing here
        load_config("countdown-tiny", [f"model.init_from={run}", "model.name=mymodel"])
    assert "was trained on mymodel" in refused.value.message
    assert "set model.name=../start/mymodel" in refused.value.message  # the way that works from here


def test_a_resumed_init_from_run_needs_only_its_own_copy_of_the_start(started, monkeypatch, capsys):
    start, run, other = started
    monkeypatch.chdir(start)
    base = ("--set", f"model.init_from={run}", "--out", "rl")
    code, err = cli(monkeypatch, capsys, "train", *TRAIN, *base, "--max-steps", "1")
    assert code == 0, err
    run.rename(start / "moved")  # the source run is gone; rl/init_model holds what rl started from
    code, err = cli(monkeypatch, capsys, "train", *TRAIN, *base, "--max-steps", "2", "--resume")
    assert code == 0 and (start / "rl" / "checkpoints" / "step_0000002").is_dir(), err
    code, err = cli(monkeypatch, capsys, "train", *TRAIN, "--set", f"model.init_from={run}", "--out", "rl2")
    assert code == 2 and "is not a run directory" in err, err  # a new run still needs its source
    assert json.loads((start / "rl" / "init_model" / "tinyrl_export.json").read_text())["run_dir"] == str(run)


def test_a_run_that_does_not_record_where_it_started_says_its_paths_are_read_from_here(tmp_path, monkeypatch, capsys,
                                                                                      caplog):
    """run.json without cwd (runs begun before 2026-11-26): its relative data file was read from
    the current directory without a word, whichever file of that name is here."""
    import pandas as pd

    from tinyrl.config import REPO_ROOT
    from tinyrl.rundir import start_run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mydata").mkdir()
    pd.read_parquet(REPO_ROOT / "data" / "countdown" / "test.parquet")[:64].to_parquet("mydata/train.parquet")
    cfg = load_config("countdown-tiny", ["data.train_path=mydata/train.parquet", "trainer.test_every=0"])
    run = tmp_path / "runs" / "old"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "timing/step": 2.0}) + "\n" for i in range(1, 5)))
    start_run(run)
    code, err = cli(monkeypatch, capsys, "estimate-cost", "--from-run", str(run), "--json")
    assert code == 0 and not caplog.records, err  # cwd kept: nothing to say (the CLI's log lines, here caplog's)
    kept = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({k: v for k, v in kept.items() if k != "cwd"}))
    code, err = cli(monkeypatch, capsys, "estimate-cost", "--from-run", str(run), "--json")
    said = " ".join(r.getMessage() for r in caplog.records)
    assert code == 0 and [r.levelname for r in caplog.records] == ["WARNING"], err
    assert (f"{run}: the run does not record where it was started (its run.json has no cwd: a run from before 2026-11-26), "
            f"so its relative paths are read from here ({tmp_path}): data.train_path = mydata/train.parquet;") in said, said
    assert "data.test_path" not in said  # a file tinyrl ships is the same wherever the run started


def test_estimate_cost_and_export_verl_print_warnings_as_train_and_eval_do(tmp_path, monkeypatch):
    """`estimate-cost --from-run` and `export-verl --from-run` set up no log handler: their
    warnings came out through Python's last-resort handler, bare, where `eval`'s and `train`'s
    (the CLI's handler, piped: "WARNING message") say their level, and INFO lines not at all."""
    import subprocess
    import sys

    import pandas as pd

    from tinyrl.config import REPO_ROOT
    from tinyrl.rundir import start_run

    start, here = tmp_path / "gone", tmp_path / "here"
    start.mkdir()
    (here / "mydata").mkdir(parents=True)
    pd.read_parquet(REPO_ROOT / "data" / "countdown" / "test.parquet")[:64].to_parquet(here / "mydata" / "train.parquet")
    monkeypatch.chdir(here)
    cfg = load_config("countdown-tiny", ["data.train_path=mydata/train.parquet", "trainer.test_every=0"])
    run = here / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "timing/step": 2.0}) + "\n" for i in range(1, 5)))
    monkeypatch.chdir(start)  # started there; its data file is no longer there
    start_run(run)
    note = f"WARNING {run}: data.train_path = mydata/train.parquet is not in {start}, where the run was started"
    for args in (["estimate-cost", "--from-run", str(run)], ["export-verl", "--from-run", str(run), "--out", "verl"]):
        done = subprocess.run([sys.executable, "-m", "tinyrl.cli", *args], capture_output=True, text=True, timeout=300,
                              cwd=here, env={**os.environ, "COLUMNS": "300"})
        assert done.returncode == 0, done.stderr[-2000:]
        assert any(line.startswith(note) for line in done.stderr.splitlines()), (args[0], done.stderr[-2000:])
