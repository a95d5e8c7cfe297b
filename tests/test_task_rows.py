"""Each task checks every row's ground truth as its reward reads it, before anything is generated.
Until 2026-11-26 a file of another task's data failed after a whole rollout or evaluation
(Countdown's reward on maths rows) or was scored 0 without a word (maths on Countdown rows)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinyrl.config import load_config
from tinyrl.data.io import load_prompts
from tinyrl.errors import TinyRLError
from tinyrl.tasks import all_tasks, check_rows, get_task
from tinyrl.tasks.rewards import check_reward_rows

ENV = {**os.environ, "COLUMNS": "160", "HF_HUB_OFFLINE": "1"}
COUNTDOWN_TEST = Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet"
SAME_TRUTH = {frozenset({"math", "retool"})}  # one answer format: each reads the other's rows


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, list[dict]]:
    """Each task's own generated test rows."""
    out = {}
    for name, task in all_tasks().items():
        where = tmp_path_factory.mktemp(name)
        _, test = task.generate(where, 8, 8, seed=0, progress=False)
        out[name] = load_prompts(test).to_dict("records")
    return out


def test_every_task_reads_its_own_rows_and_refuses_every_other_tasks(generated):
    for name, task in all_tasks().items():
        for other, rows in generated.items():
            if other == name or frozenset({name, other}) in SAME_TRUTH:
                check_rows(task, rows, f"{other}.parquet")  # its own: no problem
                continue
            with pytest.raises(TinyRLError, match=rf"{other}.parquet: 8 of 8 rows cannot be scored by the {name} ") as err:
                check_rows(task, rows, f"{other}.parquet")
            if name == "countdown":  # it said "(TypeError: string indices must be integers, not 'str')"
                said = err.value.message
                assert "Error" not in said and "indices" not in said, said
                assert "countdown's is {\"target\": int, \"numbers\": [int, ...]}" in said, said
                if other in ("math", "retool"):  # a plain answer
                    assert "a plain answer like this is another task's ground truth" in said, said


def test_one_bad_row_is_named_by_its_place(generated):
    rows = [dict(r) for r in generated["math"]]
    rows[5] = {**rows[5], "reward_model": {"style": "rule", "ground_truth": ["3", "3.0"]}}
    with pytest.raises(TinyRLError) as err:
        check_rows(get_task("math"), rows, "mine.parquet")
    assert "1 of 8 rows" in err.value.message and "first at row 5" in err.value.message
    assert "['3', '3.0'], not a maths answer" in err.value.message


def test_a_users_reward_function_reads_rows_its_own_way(generated, tmp_path):
    fn = tmp_path / "mine.py"
    fn.write_text("def score(completion, row):\n    return 0.0\n")
    mine = load_config("math-tiny", [f"reward.fn={fn}:score"])
    check_reward_rows(mine, generated["countdown"], "countdown.parquet")  # not checked: no error
    extra = load_config("math-tiny", [f"reward.fn={fn}:score", "reward.extra_fns=[\"countdown\"]"])
    with pytest.raises(TinyRLError, match="countdown task.s reward"):  # a task among the extra functions: checked
        check_reward_rows(extra, generated["math"], "math.parquet")


def tinyrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tinyrl.cli", *args], capture_output=True, text=True,
                          timeout=300, env=ENV)


def test_train_and_eval_on_another_tasks_file_stop_before_generating(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    done = tinyrl("train", "--preset", "math-tiny", "--out", str(run), "--no-dashboard", "--max-steps", "1",
                  "--set", f"data.train_path={COUNTDOWN_TEST}")
    said = " ".join(done.stderr.replace("│", " ").split())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "1,024 of 1,024 rows cannot be scored by the math task's reward" in said
    assert "data_source is 'countdown'" in said and not (run / "metrics.jsonl").exists()
    done = tinyrl("eval", str(tiny_model_dir), "--task", "math", "--data", str(COUNTDOWN_TEST), "--n", "0",
                  "--out", str(tmp_path / "eval"))
    said = " ".join(done.stderr.replace("│", " ").split())
    assert done.returncode == 2 and "cannot be scored by the math task's reward" in said, done.stderr
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize("command, preset, key", [("train", "math-tiny", "data.train_path"),
                                                  ("train", "math-tiny", "data.val_files"),
                                                  ("sft", "countdown-tiny-sft", "data.test_path")])
def test_another_tasks_file_is_said_before_the_memory_plan_and_any_model(tmp_path, monkeypatch, capsys,
                                                                       command, preset, key):
    """On a card the plan (and model.init_from's merge of an SFT run) came first, then the row
    check; `sft` checked its test file after loading the model. Now nothing of that is reached."""
    from tinyrl.cli import main

    maths = tmp_path / "maths.parquet"
    get_task("math").generate(tmp_path / "m", 8, 8, seed=0, progress=False)[1].rename(maths)
    other = COUNTDOWN_TEST if command == "train" else maths  # the maths task on Countdown; Countdown on maths
    value = f'["c={other}"]' if key == "data.val_files" else str(other)

    def reached(*_, **__):
        raise AssertionError("the memory plan was reached")

    monkeypatch.setattr("tinyrl.preflight.preflight", reached)
    monkeypatch.setattr(sys, "argv", ["tinyrl", command, "--preset", preset, "--out", str(tmp_path / "run"),
                                      "--no-dashboard", "--set", f"{key}={value}"])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exited:
        main()
    said = " ".join(capsys.readouterr().err.replace("│", " ").split())
    assert exited.value.code == 2 and f"{other}: " in said and "cannot be scored by the" in said, said
    assert not (tmp_path / "run" / "config.json").exists()
    if key != "data.train_path":  # a held-out file: its ways out (a user's own task kept the preset's test file)
        assert "--set reward.fn=file.py:func" in said, said
        assert ("sft.val_generate=false" if command == "sft" else
                f"--set {key}=...), or train without validation: --set trainer.test_every=0") in said, said


@pytest.mark.parametrize("command, preset", [("train", "math-tiny"), ("sft", "countdown-tiny-sft")])
def test_fewer_rows_than_one_batch_is_said_before_loading_or_writing_anything(tmp_path, monkeypatch, capsys,
                                                                              command, preset):
    """`train` said it after the model and the rollout engine (vLLM on a card) had loaded, and both
    left config.json and run.json in the run directory."""
    from tinyrl.cli import main

    task = get_task("math" if command == "train" else "countdown")
    make = task.generate if command == "train" else task.generate_sft
    small = make(tmp_path / "d", 4, 4, seed=0, progress=False)[0]
    if command == "train":
        monkeypatch.setattr("tinyrl.preflight.preflight", lambda *_: (_ for _ in ()).throw(AssertionError("planned")))
    monkeypatch.setattr(sys, "argv", [
        "tinyrl", command, "--preset", preset, "--out", str(tmp_path / "run"), "--no-dashboard",
        "--set", f"data.train_path={small}", "--set", "trainer.test_every=0"])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exited:
        main()
    said = " ".join(capsys.readouterr().err.replace("│", " ").split())
    assert exited.value.code == 2 and "has 4 " in said and "fewer than one batch" in said, said
    assert not [p.name for p in (tmp_path / "run").glob("*.json")]


def test_a_problem_answer_table_as_training_data_names_the_tasks_converter(tmp_path, monkeypatch, capsys):
    """A user's problem/answer table given straight to the maths preset: the hint named
    `tinyrl data countdown`, whatever the task; it now names the run's task's own command, which
    converts that table (and a JSON-lines copy gets the line that makes it parquet first)."""
    import pandas as pd

    from tinyrl.cli import main

    table = pd.DataFrame({"problem": ["What is 2+3?"] * 8, "answer": ["5"] * 8})
    said = {}
    for name, write in (("t.parquet", table.to_parquet),
                        ("t.jsonl", lambda p: table.to_json(p, orient="records", lines=True))):
        write(tmp_path / name)
        monkeypatch.setattr(sys, "argv", ["tinyrl", "train", "--preset", "math-tiny", "--out", str(tmp_path / "run"),
                                          "--no-dashboard", "--set", f"data.train_path={tmp_path / name}"])
        monkeypatch.setenv("COLUMNS", "200")
        with pytest.raises(SystemExit) as exited:
            main()
        said[name] = " ".join(capsys.readouterr().err.replace("│", " ").split())
        assert exited.value.code == 2, said[name]
    assert "lacks column(s) prompt, reward_model; it has: problem, answer" in said["t.parquet"]
    assert "`tinyrl data math --from FILE" in said["t.parquet"] and "countdown" not in said["t.parquet"]
    assert "read_json(f, lines=True).to_parquet(" in said["t.jsonl"]
    # the suffix says what it is (Arrow's "ArrowInvalid: Parquet magic bytes not found" was said first)
    assert f"{tmp_path / 't.jsonl'} is a JSON-lines file; tinyrl reads parquet" in said["t.jsonl"]
    assert "Arrow" not in said["t.jsonl"] and "magic" not in said["t.jsonl"], said["t.jsonl"]
    # t.parquet, the user's own, is there: the conversion writes beside it, not over it
    assert f"to_parquet('{tmp_path / 't-converted.parquet'}')" in said["t.jsonl"], said["t.jsonl"]
    assert f"'{tmp_path / 't.parquet'}'" not in said["t.jsonl"]
    # a problem/answer table converted as told still lacks prompt and reward_model: the same hint
    # names `tinyrl data math --from`, which it dropped until 2026-11-27 (it ended on "give X;");
    # it read as if that layout were "a problem and an answer" until 2026-11-28; the command converts this file
    assert "so it must already have prompt and reward_model; a plain table of problems and answers is the other " \
        f"case: `tinyrl data math --from {tmp_path / 't.jsonl'} --out DIR` converts it" in said["t.jsonl"], said["t.jsonl"]
    assert not (tmp_path / "run" / "config.json").exists()
