"""Bad input a new user gives that used to end in a traceback (issue 29 item 4): each is now one
screen, exit code 2, said before any model loads, and nothing the user owns is changed."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tinyrl.config import ANY_INTEGER, AT_LEAST_ONE, OWN_RULE, Config, _settings_of_type, load_config, problems_of
from tinyrl.errors import TinyRLError

ENV = {**os.environ, "COLUMNS": "160", "HF_HUB_OFFLINE": "1"}
TEST_DATA = Path(__file__).resolve().parent.parent / "data" / "countdown" / "test.parquet"


def tinyrl(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tinyrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def one_screen(done: subprocess.CompletedProcess) -> str:
    """The error as the user reads it (exit 2, no traceback, one screen), joined into one line."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) < 25, done.stderr
    return " ".join(done.stderr.replace("│", " ").split())


def train(run: Path, *sets: str) -> subprocess.CompletedProcess:
    args = ["train", "--preset", "countdown-tiny", "--out", str(run), "--no-dashboard", "--max-steps", "1"]
    for item in sets:
        args += ["--set", item]
    return tinyrl(*args)


# ------------------------------------------------------------------ counts and steps

def test_every_count_setting_is_checked_with_the_others():
    """An invariant over every integer setting, so a key added later is covered: below its
    minimum it is a problem naming the key, reported with all the others at once."""
    ints = _settings_of_type(Config(), int)
    assert "trainer.max_steps" in ints and "trainer.save_every" in ints
    checked = [k for k in ints if k not in ANY_INTEGER + OWN_RULE]
    too_small = [f"{k}={0 if k in AT_LEAST_ONE else -3}" for k in checked]
    problems = problems_of(load_config("countdown-tiny", too_small, check=False))
    for key in checked:
        assert any(p.startswith(f"{key} = ") for p in problems), key
    for key in OWN_RULE:  # their own rules still speak for them
        assert any(p.startswith(f"{key} = ") for p in
                   problems_of(load_config("countdown-tiny", [f"{key}=-3"], check=False))), key
    seeds = problems_of(load_config("countdown-tiny", [f"{k}=-3" for k in ANY_INTEGER], check=False))
    assert not any(p.startswith(k) for p in seeds for k in ANY_INTEGER)
    assert problems_of(load_config("countdown-tiny", ["trainer.max_steps=0"], check=False)) == []


def test_negative_max_steps_is_exit_2_before_anything_runs(tmp_path):
    text = one_screen(train(tmp_path / "run", "trainer.max_steps=-3"))
    assert "trainer.max_steps = -3 must be >= 0" in text
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ the data

def test_all_prompts_empty_is_exit_2_before_the_model_loads(tmp_path):
    rows = pd.read_parquet(TEST_DATA).head(64)
    rows["prompt"] = [[{"role": "user", "content": ""}] for _ in range(len(rows))]
    rows.to_parquet(tmp_path / "empty.parquet")
    text = one_screen(train(tmp_path / "run", f"data.train_path={tmp_path / 'empty.parquet'}",
                            "trainer.test_every=0"))
    assert "64 of 64 prompts in" in text and "are empty (first at row 0" in text
    assert not (tmp_path / "run" / "config.json").exists()  # written once the models exist


def test_one_empty_prompt_is_named_by_its_row(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from tinyrl.setup import tokenize_rows

    rows = pd.read_parquet(TEST_DATA).head(8)
    rows.at[5, "prompt"] = [{"role": "user", "content": ""}]
    rows.to_parquet(tmp_path / "one.parquet")
    with pytest.raises(TinyRLError, match=r"1 of 8 prompts .* are empty \(first at row 5"):
        tokenize_rows(tmp_path / "one.parquet", AutoTokenizer.from_pretrained(tiny_model_dir), 256)
    # through the chat template (data.chat_template, every task with tools): the template's role
    # words made the prompt non-empty, and the row trained on them alone (a new user's walk)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    with pytest.raises(TinyRLError, match=r"1 of 8 prompts .* are empty \(first at row 5"):
        tokenize_rows(tmp_path / "one.parquet", tok, 256, chat=True)
    rows.at[5, "prompt"] = [{"role": "system", "content": "  "}, {"role": "user", "content": "\n"}]
    rows.to_parquet(tmp_path / "blank.parquet")
    with pytest.raises(TinyRLError, match=r"1 of 8 prompts .* are empty \(first at row 5"):
        tokenize_rows(tmp_path / "blank.parquet", tok, 256, chat=True)
    rows.at[5, "prompt"] = [{"role": "user", "content": "1 + 1?"}]
    rows.to_parquet(tmp_path / "fine.parquet")
    assert len(tokenize_rows(tmp_path / "fine.parquet", tok, 256, chat=True)[0]) == 8


def _system_and_user(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows.copy()
    rows["prompt"] = [[{"role": "system", "content": "You solve Countdown."}, {"role": "user", "content": p[0]["content"]}]
                      for p in rows["prompt"]]
    return rows


def test_a_prompt_of_several_messages_is_refused_by_train_and_sft_before_the_model_loads(tmp_path):
    """data.chat_template = false feeds a prompt as text: a system + user prompt trained on the
    system message alone, exit 0 (a user's walk). Refused with the row and its roles, nothing written."""
    _system_and_user(pd.read_parquet(TEST_DATA).head(64)).to_parquet(tmp_path / "sysuser.parquet")
    text = one_screen(train(tmp_path / "run", f"data.train_path={tmp_path / 'sysuser.parquet'}"))
    assert "64 of 64 prompts in" in text and "hold more than one message (first at row 0" in text
    assert "roles system, user" in text and "data.chat_template=true" in text
    assert not (tmp_path / "run").exists()
    # the test file too (validation): the training file is fine, the held-out one is not
    text = one_screen(train(tmp_path / "run", f"data.test_path={tmp_path / 'sysuser.parquet'}"))
    assert "hold more than one message" in text and not (tmp_path / "run").exists()
    # SFT's single-turn prompts (prompt + response columns), the test file switched off
    sft = _system_and_user(pd.read_parquet(TEST_DATA.with_name("sft_test.parquet")).head(64))
    sft.to_parquet(tmp_path / "sft.parquet")
    text = one_screen(tinyrl("sft", "--preset", "countdown-tiny-sft", "--out", str(tmp_path / "sft-run"),
                             "--no-dashboard", "--max-steps", "1", "--set", f"data.train_path={tmp_path / 'sft.parquet'}",
                             "--set", "trainer.test_every=0"))
    assert "64 of 64 prompts in" in text and "roles system, user" in text
    assert not (tmp_path / "sft-run").exists()


def test_several_messages_reach_the_model_through_the_chat_template_only(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from tinyrl.data.io import prompt_text
    from tinyrl.eval import evaluate
    from tinyrl.setup import tokenize_rows

    rows = _system_and_user(pd.read_parquet(TEST_DATA).head(4))
    rows.at[2, "prompt"] = [{"role": "user", "content": "one message"}]
    rows.to_parquet(tmp_path / "sysuser.parquet")
    assert prompt_text(rows.iloc[2]) == "one message" and prompt_text({"prompt": "text"}) == "text"
    with pytest.raises(TinyRLError, match="prompt holds 2 messages \\(roles system, user\\)"):
        prompt_text(rows.iloc[0])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(TinyRLError, match="row 0 .*prompt holds 2 messages"):
        tokenize_rows(tmp_path / "sysuser.parquet", tok, 256)
    tok.chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    ids, _ = tokenize_rows(tmp_path / "sysuser.parquet", tok, 256, chat=True)
    assert tok.decode(ids[0]).startswith("<|system|>You solve Countdown.<|user|>A conversation")
    # eval: refused before its model loads, naming its own switch
    with pytest.raises(TinyRLError, match="3 of 4 prompts .*first at row 0.*without --chat-template") as caught:
        evaluate(str(tiny_model_dir), [str(tmp_path / "sysuser.parquet")], task_name="countdown", n=0,
                 out_dir=tmp_path / "ev", progress=False)
    assert "--chat-template" in caught.value.hint


# ------------------------------------------------------------------ --out

def test_out_an_existing_file_is_exit_2_and_the_file_is_kept(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    text = one_screen(train(mine))
    assert f"--out {mine} is a file, not a directory" in text
    text = one_screen(train(mine / "run"))
    assert f"is inside {mine}, which is a file" in text
    assert mine.read_text() == "mine"


def test_out_on_a_read_only_filesystem_is_exit_2_before_loading(tmpfs):
    disk = tmpfs(1 << 20, read_only=True)
    with pytest.raises(OSError):
        (disk / "x").write_text("x")  # the mount really is read-only, for root too
    text = one_screen(train(disk / "run"))
    assert f"cannot write in {disk} (a read-only filesystem)" in text and "nothing was loaded" in text


def test_write_check_reports_the_os_reason(tmp_path, monkeypatch):
    """Where no filesystem can be mounted: the same check, with the OS's answer given to it."""
    import tempfile

    from tinyrl.writable import check_writable

    check_writable(tmp_path / "a" / "b")  # a writable place passes and leaves nothing behind
    assert list(tmp_path.iterdir()) == []

    def refuse(**kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(TinyRLError, match="a read-only filesystem"):
        check_writable(tmp_path / "run")


# ------------------------------------------------------------------ --out of the other commands

def _fake_run(where: Path) -> Path:
    """A run directory as far as the --out checks look (config.json, one metrics line)."""
    where.mkdir()
    (where / "config.json").write_text(json.dumps(load_config("countdown-tiny").to_dict()))
    (where / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.1}\n')
    return where


# command -> (its arguments before --out, what the error says was not done). {run}: a run
# directory, {src}: a problem/answer table. Until 2026-11-26 each ended in a traceback (exit 1),
# eval after its whole evaluation.
DIRECTORY_OUTS = {
    "data countdown": (["data", "countdown", "--train-size", "8", "--test-size", "4"], "nothing was written"),
    "data arith": (["data", "arith", "--train-size", "8", "--test-size", "4"], "nothing was written"),
    "data math": (["data", "math", "--from", "{src}"], "nothing was read or written"),
    "data retool": (["data", "retool", "--from", "{src}"], "nothing was read or written"),
    "eval": (["eval", "{run}", "--data", str(TEST_DATA), "--n", "0"], "nothing was evaluated"),
    "report": (["report", "{run}"], "nothing was written"),
    "export": (["export", "{run}"], "nothing was written"),
}


@pytest.mark.parametrize("command", DIRECTORY_OUTS)
def test_an_out_inside_a_file_is_exit_2_before_the_work(tmp_path, command):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    run = _fake_run(tmp_path / "run")
    src = tmp_path / "problems.parquet"
    pd.DataFrame({"problem": ["What is 2 + 3?"], "answer": ["5"]}).to_parquet(src)
    args, lost = DIRECTORY_OUTS[command]
    inside = command in ("data math", "eval", "export", "data countdown")  # the others: --out the file itself
    out = mine / "out" if inside else mine
    text = one_screen(tinyrl(*[a.format(run=run, src=src) for a in args], "--out", str(out)))
    said = f"--out {out} is inside {mine}, which is a file" if inside else f"--out {out} is a file, not a directory"
    assert said in text and lost in text, text
    assert mine.read_text() == "mine" and sorted(p.name for p in run.iterdir()) == ["config.json", "metrics.jsonl"]
    named = tmp_path / "new" / "aime.parquet"  # a file's name for the directory: it was made, as a directory
    text = one_screen(tinyrl(*[a.format(run=run, src=src) for a in args], "--out", str(named)))
    assert f"--out {named} names a directory to create, but aime.parquet looks like a file name; {lost}" in text, text
    assert f"--out {tmp_path / 'new' / 'aime'}" in text and not (tmp_path / "new").exists()


@pytest.mark.parametrize("command", ["probe-memory", "doctor"])
def test_a_file_out_that_cannot_be_written_is_exit_2_before_the_work(tmp_path, command):
    """probe-memory --out PLAN and doctor --out REPORT write a file: a directory there, or a
    file where its folder should be, is said before the plan or the two steps."""
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    lost = {"probe-memory": "nothing was planned", "doctor": "no check was run"}[command]
    base = [command, "--preset", "countdown-tiny"]
    text = one_screen(tinyrl(*base, "--out", str(mine / "plan.json")))
    assert f"--out {mine / 'plan.json'}: {mine} is a file, not a directory; {lost}" in text, text
    text = one_screen(tinyrl(*base, "--out", str(tmp_path)))
    assert f"--out {tmp_path} is a directory; {lost}" in text, text
    # a file of the user's there: it was replaced by the plan or the report, exit 0, until 2026-11-27
    what = {"probe-memory": "memory plan", "doctor": "doctor report"}[command]
    text = one_screen(tinyrl(*base, "--out", str(mine)))
    assert f"--out {mine} exists and is not a {what} tinyrl wrote; {lost}" in text, text
    other = tmp_path / "other.json"  # JSON, but another command's: the plan is not a doctor report
    other.write_text(json.dumps({"phases": {}} if command == "doctor" else {"tool": "tinyrl doctor"}))
    assert f"--out {other} exists and is not a {what}" in one_screen(tinyrl(*base, "--out", str(other)))
    assert mine.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "other.json"]


def test_probe_memory_replaces_its_own_earlier_plan_file(tmp_path):
    """A re-run with the same --out replaces the plan written there before (what --out asked for)."""
    out = tmp_path / "plan.json"
    out.write_text(json.dumps({"phases": {}, "note": "an earlier plan"}))
    done = tinyrl("probe-memory", "--preset", "countdown-tiny", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "an earlier plan" not in out.read_text() and json.loads(out.read_text())["phases"]


@pytest.mark.parametrize("command, mine", [
    ("countdown", "train.parquet"), ("countdown --sft", "sft_test.parquet"), ("arith", "test.parquet"),
    ("arith --sft", "sft_train.parquet"), ("math", "test.parquet"), ("retool", "test.parquet")])
def test_data_never_replaces_a_file_in_out(tmp_path, command, mine):
    """A user's own file where `tinyrl data` would write (TinyZero's train.parquet, an earlier
    SFT set) stays as it was and nothing else is written; countdown and arith replaced it
    without a word until 2026-11-26, math and retool wrote train.parquet before refusing test."""
    (tmp_path / mine).write_text("mine")
    name, *flags = command.split()
    text = one_screen(tinyrl("data", name, *flags, "--out", str(tmp_path), "--train-size", "8", "--test-size", "4"))
    assert f"{tmp_path / mine} already exists; nothing was written" in text, text
    assert [p.name for p in tmp_path.iterdir()] == [mine] and (tmp_path / mine).read_text() == "mine"


# ------------------------------------------------------------------ tinyrl eval

def test_eval_of_a_run_without_checkpoints_says_so(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(load_config("countdown-tiny").to_dict()))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    text = one_screen(tinyrl("eval", str(run), "--data", str(TEST_DATA), "--n", "0"))
    assert f"{run} has no checkpoint yet" in text and "every 10 steps" in text and "--task" not in text
    (run / "checkpoints").mkdir()  # made, still empty
    assert f"{run} has no checkpoint yet" in one_screen(tinyrl("eval", str(run), "--data", str(TEST_DATA)))


@pytest.mark.parametrize("where", ["missing/run", "./missing", "{tmp}/missing"])
def test_eval_of_a_path_that_does_not_exist_says_so(tmp_path, where, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "missing").mkdir() if where == "missing/run" else None  # runs/NAME with runs/ there
    target = where.format(tmp=tmp_path)
    # without --data too: it said "--data and --task are needed for missing/run" (found by a new user)
    for extra in ([], ["--task", "countdown"], ["--data", str(TEST_DATA)], ["--data", str(TEST_DATA), "--task", "countdown"]):
        text = one_screen(tinyrl("eval", target, "--n", "0", *extra))
        assert f"{target}: no such directory" in text and "tokenizer" not in text and "needed" not in text


def test_eval_of_a_mistyped_run_directory_names_the_nearest_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "countdown-demo").mkdir(parents=True)
    text = one_screen(tinyrl("eval", "runs/countdown-dem"))
    assert "runs/countdown-dem: no such directory" in text and "did you mean runs/countdown-demo?" in text


def test_eval_of_an_unknown_model_id_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing called nobody/ here: taken as a Hugging Face id (offline)
    text = one_screen(tinyrl("eval", "nobody/no-such-model", "--data", str(TEST_DATA), "--n", "0"))
    assert "--task is needed for nobody/no-such-model, which is no directory here" in text
    # a mistyped run directory where no runs/ exists reads as an id too: the hint says none is there
    assert f"if you meant a run or model directory: none is at {tmp_path / 'nobody' / 'no-such-model'}" in text
    text = one_screen(tinyrl("eval", "nobody/no-such-model", "--data", str(TEST_DATA), "--n", "0",
                             "--task", "countdown"))
    assert "nobody/no-such-model: no such directory here, and no Hugging Face model" in text
    assert "model.name" not in text.split("what to do")[-1]


@pytest.mark.parametrize("command", ["math", "retool", "retool --sft"])
def test_data_name_is_a_file_name_not_a_way_out_of_out(tmp_path, command):
    """`data math --from f.csv --name ../../escape --out d` wrote d/../../escape.parquet, exit 0."""
    source = tmp_path / "src.jsonl"
    source.write_text(json.dumps({"problem": "What is 2+3?", "answer": "5"}) + "\n")
    out = tmp_path / "a" / "b" / "out"
    text = one_screen(tinyrl("data", *command.split(), "--from", str(source), "--name", "../../escape",
                             "--out", str(out)))
    assert "--name '../../escape' is not a file name" in text, text
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["src.jsonl"]
