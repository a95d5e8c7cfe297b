"""Generated training data belongs to the settings that made them: a run with other task options,
template, size or seed never reads (or validates on) a file made with another's, and never
replaces it. Until 2026-11-28 `--set task.operands=[2]` on a preset whose generated file existed
trained on that file's 3- and 4-number tasks, exit 0, without a word."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import tinyrl.config as config_mod
from tinyrl.config import files as config_files  # where resolve_path reads the checkout
from tinyrl.config import load_config
from tinyrl.setup import ensure_train_data, kept_as_it_is_note, record_path, settle_train_path

SMALL = ["data.generate_train_size=64", "trainer.test_every=0"]
EASY = ["task.operands=[2]", "task.max_number=20"]


@pytest.fixture()
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(config_files, "REPO_ROOT", tmp_path / "no-repo")  # not the repo's own runs/
    return tmp_path


def nums(path: Path) -> list[list[int]]:
    return [list(n) for n in pd.read_parquet(path)["nums"]]


def test_changed_generation_settings_get_data_made_with_them(here):
    first = ensure_train_data(load_config("countdown-tiny", SMALL))  # the preset's own path, first use
    assert first == Path("runs/data/countdown-tiny/train.parquet")
    kept = first.read_bytes()
    assert {len(n) for n in nums(first)} == {3, 4}
    assert json.loads(record_path(first).read_text())["settings"]["options"] == {"operands": [3, 4], "max_number": 100}

    cfg = load_config("countdown-tiny", SMALL + EASY + ["task.template=qwen-instruct"])
    note = settle_train_path(cfg)
    assert note and "task.operands [3, 4] -> [2]" in note and "task.template" in note
    path = ensure_train_data(cfg)
    assert path != first and cfg.data.train_path == path.as_posix()  # config.json records this path
    assert {len(n) for n in nums(path)} == {2} and max(max(n) for n in nums(path)) <= 20
    assert all("<|im_start|>" in p[0]["content"] for p in pd.read_parquet(path)["prompt"])
    assert first.read_bytes() == kept  # the other run's file: untouched

    again = load_config("countdown-tiny", SMALL + EASY + ["task.template=qwen-instruct"])
    mtime = path.stat().st_mtime_ns
    assert ensure_train_data(again) == path and path.stat().st_mtime_ns == mtime  # made once
    assert ensure_train_data(load_config("countdown-tiny", SMALL)) == first  # the preset's settings: its file


def test_generate_false_reads_the_file_as_it_is_and_says_whose_settings_made_it(here):
    first = ensure_train_data(load_config("countdown-tiny", SMALL))
    cfg = load_config("countdown-tiny", SMALL + EASY + ["data.generate=false"])
    assert settle_train_path(cfg) is None and cfg.data.train_path == first.as_posix()  # kept: the user said so
    note = kept_as_it_is_note(cfg)
    assert note and "task.operands [3, 4] -> [2]" in note and "data.generate = false" in note
    same = load_config("countdown-tiny", SMALL + ["data.generate=false"])
    assert kept_as_it_is_note(same) is None                   # its own settings: nothing to say


def test_generated_test_file_beside_it_follows_the_settings(here):
    ensure_train_data(load_config("countdown-tiny", SMALL))
    cfg = load_config("countdown-tiny", SMALL + EASY + ["data.test_path=runs/data/countdown-tiny/test.parquet"])
    ensure_train_data(cfg)
    test = Path(cfg.data.test_path)
    assert test.parent == Path(cfg.data.train_path).parent != Path("runs/data/countdown-tiny")
    assert {len(n) for n in nums(test)} == {2}
    assert {len(n) for n in nums(Path("runs/data/countdown-tiny/test.parquet"))} == {3, 4}


def test_an_older_unrecorded_file_is_left_alone_but_resume_keeps_it(here):
    first = ensure_train_data(load_config("countdown-tiny", SMALL))
    record_path(first).unlink()  # as an older tinyrl left it: no record of its settings
    kept = first.read_bytes()
    cfg = load_config("countdown-tiny", SMALL)
    assert "no record" in settle_train_path(cfg)
    assert ensure_train_data(cfg) != first and first.read_bytes() == kept
    run = here / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"data": {"train_path": first.as_posix()}}))
    assert ensure_train_data(load_config("countdown-tiny", SMALL), resume_dir=run) == first  # its own rows


def test_a_file_in_the_keyed_folder_without_its_record_is_refused(here):
    from tinyrl.errors import TinyRLError

    ensure_train_data(load_config("countdown-tiny", SMALL))
    cfg = load_config("countdown-tiny", SMALL + EASY)
    settle_train_path(cfg)
    mine = Path(cfg.data.train_path)
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"not tinyrl's")
    with pytest.raises(TinyRLError, match="not a file tinyrl generated"):
        ensure_train_data(load_config("countdown-tiny", SMALL + EASY))
    assert mine.read_bytes() == b"not tinyrl's"


def test_validating_on_the_presets_tasks_with_other_task_settings_is_said(tmp_path, monkeypatch):
    from tinyrl.setup import held_out_note

    monkeypatch.chdir(tmp_path)  # the shipped test file is still found (the repo's data/)
    preset = load_config("countdown-tiny", [])
    cfg = load_config("countdown-tiny", SMALL[:1] + EASY)
    settle_train_path(cfg)
    note = held_out_note(cfg, preset)
    assert note and "task.operands [3, 4] -> [2]" in note
    assert f"data.test_path={Path(cfg.data.train_path).parent / 'test.parquet'}" in note
    same = load_config("countdown-tiny", SMALL[:1])  # the size and seed alone: the same tasks
    assert held_out_note(same, preset) is None
    shutil.copyfile(config_mod.resolve_path(preset.data.test_path), tmp_path / "mine.parquet")
    own = load_config("countdown-tiny", SMALL[:1] + EASY + ["data.test_path=mine.parquet"])
    assert held_out_note(own, preset) is None  # the user's own choice


def test_estimate_cost_counts_the_epoch_this_run_will_train_on(here):
    from tinyrl.cost import prompts_per_epoch

    ensure_train_data(load_config("countdown-tiny", SMALL))  # 64 rows of the preset's settings
    n, source = prompts_per_epoch(load_config("countdown-tiny", ["data.generate_train_size=100", "trainer.test_every=0"] + EASY))
    assert n == 100 and "data.generate_train_size" in source  # not the 64 rows of the other settings' file
    assert prompts_per_epoch(load_config("countdown-tiny", SMALL))[0] == 64
