"""Countdown generation, the shipped test split, and parquet loading (TinyZero schema)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from tinyrl.data.countdown import generate_countdown, make_task
from tinyrl.data.io import ground_truth, load_prompts, prompt_text
from tinyrl.data.templates import countdown_prompt
from tinyrl.errors import TinyRLError
from tinyrl.rewards.countdown import compute_score
from tinyrl.rewards.registry import load_reward_fn

COLUMNS = ["target", "nums", "data_source", "prompt", "ability", "reward_model", "extra_info"]
SHIPPED = Path(__file__).resolve().parents[1] / "data" / "countdown" / "test.parquet"


def solves(nums, target, solution) -> bool:
    return compute_score(f"<answer>{solution}</answer>", {"target": target, "numbers": nums}) == 1.0


@pytest.mark.parametrize("n", [3, 4])
def test_make_task_is_solvable(n):
    rng = random.Random(n)
    for _ in range(300):
        nums, target, solution = make_task(rng, n)
        assert len(nums) == n and all(1 <= x <= 100 for x in nums)
        assert type(target) is int and 1 <= target <= 1000
        assert solves(nums, target, solution), (nums, target, solution)


def test_generate_round_trip(tmp_path):
    train_path, test_path = generate_countdown(tmp_path, 40, 12, seed=3, progress=False)
    assert (train_path, test_path) == (tmp_path / "train.parquet", tmp_path / "test.parquet")
    keys = {}
    for path, split, size in ((train_path, "train", 40), (test_path, "test", 12)):
        df = load_prompts(path)
        assert list(df.columns) == COLUMNS and len(df) == size
        assert set(df.data_source) == {"countdown"} and set(df.ability) == {"math"}
        for i, row in df.iterrows():
            gt = ground_truth(row)
            assert gt == {"target": int(row.target), "numbers": [int(x) for x in row.nums]}
            assert type(gt["target"]) is int and all(type(x) is int for x in gt["numbers"])
            assert prompt_text(row) == countdown_prompt(gt["numbers"], gt["target"], "base")
            assert row.prompt[0]["role"] == "user" and row.reward_model["style"] == "rule"
            assert row.extra_info["split"] == split and row.extra_info["index"] == i
            assert solves(gt["numbers"], gt["target"], row.extra_info["solution"])
        keys[split] = {(tuple(sorted(n)), t) for n, t in zip(df.nums, df.target)}
    assert not keys["train"] & keys["test"]


def test_same_seed_same_files_other_seed_other_tasks(tmp_path):
    a = generate_countdown(tmp_path / "a", 30, 10, seed=7, progress=False)
    b = generate_countdown(tmp_path / "b", 30, 10, seed=7, progress=False)
    c = generate_countdown(tmp_path / "c", 30, 10, seed=8, progress=False)
    for x, y, z in zip(a, b, c):
        assert pq.read_table(x).equals(pq.read_table(y))
        assert not pq.read_table(x).equals(pq.read_table(z))
    # Test rows depend on the seed and test size only, not on the train size.
    d = generate_countdown(tmp_path / "d", 5, 10, seed=7, progress=False)
    assert pq.read_table(d[1]).equals(pq.read_table(a[1]))


def test_qwen_instruct_template(tmp_path):
    _, test = generate_countdown(tmp_path, 3, 3, template="qwen-instruct", progress=False)
    row = load_prompts(test).iloc[0]
    gt = ground_truth(row)  # plain ints: numpy 2 would print [np.int64(15), ...] in a prompt
    assert prompt_text(row) == countdown_prompt(gt["numbers"], gt["target"], "qwen-instruct")


def test_progress_bar_stays_off_stdout(tmp_path, capsys):
    generate_countdown(tmp_path, 5000, 5, progress=True)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("kwargs,match", [
    ({"train_size": 0}, "train_size"), ({"test_size": -1}, "test_size"),
    ({"train_size": 2.5}, "train_size"), ({"template": "chatml"}, "template"),
])
def test_bad_arguments(tmp_path, kwargs, match):
    args = {"out_dir": tmp_path, "train_size": 2, "test_size": 2, "progress": False} | kwargs
    with pytest.raises(TinyRLError, match=match):
        generate_countdown(**args)
    assert not (tmp_path / "train.parquet").exists()


@pytest.mark.parametrize("kwargs,match", [
    ({"operands": (1, 3)}, "task.operands"), ({"operands": ()}, "task.operands"),
    ({"max_number": 1}, "task.max_number"), ({"max_number": 101}, "task.max_number"),
])
def test_bad_easier_settings(tmp_path, kwargs, match):
    args = {"out_dir": tmp_path, "train_size": 2, "test_size": 2, "progress": False} | kwargs
    with pytest.raises(TinyRLError, match=match):
        generate_countdown(**args)
    assert not (tmp_path / "train.parquet").exists()


def test_easier_setting_few_small_numbers(tmp_path):
    """task.operands / task.max_number (the CPU demo's setting): every task has the asked number
    count, numbers within the bound, a reference that solves it, and train skips test's tasks."""
    train, test = generate_countdown(tmp_path, 600, 200, seed=5, operands=(2, 3), max_number=20, progress=False)
    keys = {}
    for path in (train, test):
        df = load_prompts(path)
        assert {len(n) for n in df.nums} == {2, 3}
        assert all(1 <= x <= 20 for n in df.nums for x in n)
        assert all(solves(list(n), t, e["solution"]) for n, t, e in zip(df.nums, df.target, df.extra_info))
        keys[path.stem] = {(tuple(sorted(n)), t) for n, t in zip(df.nums, df.target)}
    assert not keys["train"] & keys["test"]


def test_a_task_space_smaller_than_the_test_split_fails_instead_of_looping(tmp_path):
    # numbers 1..2, two per task: a handful of tasks, all drawn into the 64 test tasks
    with pytest.raises(TinyRLError, match="outside the test split"):
        generate_countdown(tmp_path, 10, 64, operands=(2,), max_number=2, progress=False)
    assert not (tmp_path / "train.parquet").exists()


def test_shipped_test_split_is_the_documented_generation(tmp_path):
    assert SHIPPED.stat().st_size < 100_000
    _, fresh = generate_countdown(tmp_path, 1, 1024, seed=0, template="base", progress=False)
    assert pq.read_table(SHIPPED).equals(pq.read_table(fresh))
    df = load_prompts(SHIPPED)
    assert len(df) == 1024 and set(len(n) for n in df.nums) == {3, 4}
    assert all(solves(ground_truth(r)["numbers"], r.target, r.extra_info["solution"])
               for _, r in df.iterrows())


def tinyzero_frame(n: int = 3) -> pd.DataFrame:
    """Rows as TinyZero's examples/data_preprocess/countdown.py process_fn makes them."""
    rows = []
    for idx, (target, nums) in enumerate([(24, [2, 3, 4]), (65, [19, 36, 55, 7]), (7, [1, 6, 9])][:n]):
        question = countdown_prompt(nums, target, "base")
        rows.append({"target": target, "nums": nums, "data_source": "countdown",
                     "prompt": [{"role": "user", "content": question}], "ability": "math",
                     "reward_model": {"style": "rule",
                                      "ground_truth": {"target": target, "numbers": nums}},
                     "extra_info": {"split": "train", "index": idx}})
    return pd.DataFrame(rows)


def test_tinyzero_made_file_loads_and_scores(tmp_path):
    path = tmp_path / "train.parquet"
    tinyzero_frame().to_parquet(path)
    df = load_prompts(path, max_rows=2)
    assert len(df) == 2 and list(df.columns) == COLUMNS
    row = df.iloc[1]
    assert ground_truth(row) == {"target": 65, "numbers": [19, 36, 55, 7]}
    assert "Using the numbers [19, 36, 55, 7], create an equation that equals 65." in prompt_text(row)
    reward = load_reward_fn("countdown")
    assert reward("<answer>55 + 36 - 7 - 19</answer>", row) == 1.0
    assert load_reward_fn("countdown", strict=True)("ok\n<answer>55 + 36 - 7 - 19</answer>", row) == 1.0


def test_broken_and_truncated_parquet_name_the_file(tmp_path):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"this is not parquet")
    with pytest.raises(TinyRLError, match="junk.parquet"):
        load_prompts(junk)
    good = tmp_path / "good.parquet"
    tinyzero_frame().to_parquet(good)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(TinyRLError, match="cut.parquet"):
        load_prompts(cut)
    lines = tmp_path / "rows.jsonl"  # verl's schema as JSON lines: the hint converts it
    tinyzero_frame().to_json(lines, orient="records", lines=True)
    with pytest.raises(TinyRLError) as info:
        load_prompts(lines)
    assert "read_json(f, lines=True).to_parquet(" in info.value.hint and str(tmp_path / "rows.parquet") in info.value.hint
    # the suffix says what the file is: said plainly, without Arrow's "Parquet magic bytes not found"
    assert info.value.message == f"{lines} is a JSON-lines file; tinyrl reads parquet", info.value.message
    # a rows.parquet of the user's own is not the target (following the hint overwrote it until 2026-11-28)
    for taken, then in (("rows.parquet", "rows-converted.parquet"), ("rows-converted.parquet", "rows-converted-2.parquet")):
        (tmp_path / taken).write_bytes(b"the user's own")
        with pytest.raises(TinyRLError) as info:
            load_prompts(lines)
        assert f"to_parquet('{tmp_path / then}')\" and give {tmp_path / then};" in info.value.hint, info.value.hint
        assert f"'{tmp_path / taken}'" not in info.value.hint


@pytest.mark.parametrize("preset,said", [
    # math-tiny's train file is generated on first use: the task's hint for it has no --from, and
    # the sniffing of it ("--from" in the hint) sent a table's owner to `tinyrl data math --out
    # runs/data/math-tiny`, which generates problems and reads no table
    ("math-tiny", "a plain table of problems and answers is the other case: `tinyrl data math --from mine.jsonl "
                  "--out DIR` converts it"),
    ("countdown-tiny", "if it is not, make a file of the countdown task's prompts with `tinyrl data countdown"),
])
def test_a_plain_table_given_as_data_is_sent_to_the_tasks_converter_when_it_has_one(tmp_path, monkeypatch, capsys,
                                                                                   preset, said):
    from test_safety import cli

    monkeypatch.chdir(tmp_path)
    pd.DataFrame({"problem": ["1 + 1"], "answer": ["2"]}).to_json("mine.jsonl", orient="records", lines=True)
    code, err = cli(monkeypatch, capsys, "train", "--preset", preset, "--no-dashboard", "--set",
                    "data.test_path=mine.jsonl")
    assert code == 2 and "mine.jsonl is a JSON-lines file" in err and said in err, err
    assert "`tinyrl data countdown --from" not in err  # countdown converts no table


def test_the_tasks_that_convert_a_plain_table_are_those_whose_data_command_reads_one():
    """Task.converts_tables is a fact of each task's `tinyrl data NAME`: it has --from for tables."""
    import inspect

    from tinyrl.tasks import all_tasks, table_hint

    for name, task in all_tasks().items():
        reads_tables = "source" in inspect.signature(task.data_command).parameters  # its --from FILE
        assert task.converts_tables == reads_tables, name
        assert bool(table_hint(task, Path("t.csv"))) == reads_tables and not table_hint(task, Path("t.csv"), sft=True)


def test_missing_columns_name_file_columns_and_what_is_there(tmp_path):
    path = tmp_path / "half.parquet"
    tinyzero_frame().drop(columns=["reward_model"]).to_parquet(path)
    with pytest.raises(TinyRLError) as info:
        load_prompts(path)
    msg = str(info.value)
    assert "half.parquet lacks column(s) reward_model;" in msg and "it has: target, nums" in msg


def test_empty_missing_and_directory(tmp_path):
    empty = tmp_path / "empty.parquet"
    tinyzero_frame().iloc[:0].to_parquet(empty)
    with pytest.raises(TinyRLError, match="empty.parquet has no rows"):
        load_prompts(empty)
    with pytest.raises(TinyRLError, match="not found.*nope.parquet"):
        load_prompts(tmp_path / "nope.parquet")
    with pytest.raises(TinyRLError, match="is a directory"):
        load_prompts(tmp_path)
    with pytest.raises(TinyRLError, match="max_rows"):
        load_prompts(SHIPPED, max_rows=0)


def test_max_rows_reads_the_first_rows():
    df = load_prompts(SHIPPED, max_rows=5)
    assert list(df.extra_info.map(lambda e: e["index"])) == [0, 1, 2, 3, 4]


def test_prompt_text_and_ground_truth_accept_plain_values():
    row = {"prompt": "plain text", "reward_model": {"ground_truth": {"target": np.int64(3),
                                                                     "numbers": np.array([1, 2])}}}
    assert prompt_text(row) == "plain text"
    gt = ground_truth(row)
    assert gt == {"target": 3, "numbers": [1, 2]} and type(gt["target"]) is int
    with pytest.raises(TinyRLError, match="prompt"):
        prompt_text({"prompt": []})
    with pytest.raises(TinyRLError, match="ground_truth"):
        ground_truth({"reward_model": {}})


def test_shipped_demo_split_is_the_documented_generation(tmp_path):
    """data/countdown-demo: what the demo presets' first use generates beside their training file."""
    demo = SHIPPED.parent.parent / "countdown-demo"
    generate_countdown(tmp_path, 1, 1024, seed=0, operands=(2,), max_number=50, sft=True, progress=False)
    for name in ("test.parquet", "sft_test.parquet"):
        assert pq.read_table(demo / name).equals(pq.read_table(tmp_path / name)), name


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError])
def test_an_interrupted_generation_leaves_no_file_in_out(tmp_path, monkeypatch, stop):
    """Ctrl-C (or a full disk) after train.parquet is written but before test.parquet: --out holds
    neither, nor the hidden staging folder, so a rerun is not refused and train never reads half
    a set. A second run then writes both."""
    import tinyrl.data.countdown as countdown

    real, calls = countdown.pq.write_table, []

    def write_then_stop(table, where, **kwargs):
        calls.append(Path(where).name)
        if len(calls) == 2:
            raise stop(28, "No space left on device") if stop is OSError else stop()
        real(table, where, **kwargs)

    monkeypatch.setattr(countdown.pq, "write_table", write_then_stop)
    with pytest.raises(TinyRLError if stop is OSError else KeyboardInterrupt):
        generate_countdown(tmp_path, 16, 4, progress=False)
    assert calls == ["train.parquet", "test.parquet"] and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(countdown.pq, "write_table", real)
    generate_countdown(tmp_path, 16, 4, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.parquet", "train.parquet"]


def test_a_ctrl_c_mid_write_of_tinyrl_data_says_so_and_leaves_no_file(tmp_path):
    """The real command, SIGINT after train.parquet is written and before test.parquet: it ended
    silently (Typer's exit 130); now one line, exit 130, and --out holds no file."""
    from helpers.busy_child import interrupt_when_busy

    out = tmp_path / "data"
    done = interrupt_when_busy("pyarrow.parquet:write_table", 1, ["data", "countdown", "--out", str(out),
                               "--train-size", "16", "--test-size", "4"], tmp_path / "busy")
    assert done.returncode == 130, done.stderr[-3000:]
    assert done.stderr.strip() == "stopped by SIGINT (Ctrl-C) while writing the countdown data; no data file was written"
    assert not out.exists() or list(out.iterdir()) == []


def test_data_countdown_names_its_own_flags(tmp_path):
    """`tinyrl data countdown --template nosuch --operands 1` said `set task.template ...` and
    `task.operands = [1]`: the config's words, not this command line's. All at once, nothing written."""
    from tinyrl.tasks.countdown import data_command

    with pytest.raises(TinyRLError) as info:
        data_command(out_dir=tmp_path / "d", train_size=2, test_size=2, seed=0, template="nosuch",
                     operands="1,7", max_number=1, sft=False)
    message = info.value.message
    assert message == ("--template 'nosuch' is not a template: choose one of base, qwen-instruct; --operands 1,7 must "
                       "list numbers-per-task counts from 2 to 6, e.g. 3,4; --max-number 1 must be an integer from 2 "
                       "to 100; nothing was written"), message
    assert "task." not in message + info.value.hint and not (tmp_path / "d").exists()
