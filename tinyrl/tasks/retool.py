"""ReTool (verl's recipe/retool): maths problems solved with a Python code interpreter.

Prompts: a system message (SYSTEM_PROMPT: the model may call `code_interpreter`, and ends with its
answer in \\boxed{}) and the problem as the user message; the chat template renders them with the
tool's schema (Task.tools), and a rollout is an episode of assistant and tool turns.

Reward: the maths task's (tinyrl.tasks.math.compute_score: the last \\boxed{} or "Answer:" line,
math-verify, +1 / -1), read from the model's LAST turn only (`final_turn`): the text after the
last tool response, without its tool calls. So a tool that prints "\\boxed{42}" never scores as
the model's answer. verl 0.9.1 differs here: its reward manager decodes every token after the
prompt, tool responses included (experimental/reward_loop/reward_manager/naive.py), and the
recipe's math_dapo.compute_score reads the last 300 characters of that, so an answer printed by
the tool counts there when the model's last turn gives none. export-verl's reward_fn.py calls this
module, so a verl run of an export scores as tinyrl does. `task.tool_error_penalty` is subtracted
once when any tool call of the episode failed (Episode.tool_calls; tinyrl.tasks.rewards hands the
episode to a reward that takes `episode`).

Data (`tinyrl data retool`): `--sft` turns ReTool-SFT-style rows (a user message, and one
assistant message with <code>```python ...```</code>, <interpreter>output</interpreter> and a
final <answer>...</answer>: verl's recipe/retool/retool_sft_preprocess.py reads the same) into the
`messages` + `tools` parquet `tinyrl sft` trains; without it, DAPO-Math-17k-style rows (verl's
schema) or plain problem/answer tables become RL prompts with the system prompt.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

from tinyrl.errors import TinyRLError
from tinyrl.rollout.hermes import final_turn
from tinyrl.tasks import math as maths
from tinyrl.tasks.base import RewardFn, Task, option, say_wrote
from tinyrl.writable import ANOTHER_OUT, check_writable, make_dir, refuse_existing, staged

TOOLS = ("code_interpreter",)
SYSTEM_PROMPT = (
    "You solve maths problems and may use a Python code interpreter. Whenever a step needs exact "
    "computation (arithmetic, algebra, counting, checking a guess), call the code_interpreter tool "
    "with a short program; it runs in a fresh interpreter and returns what the program prints, so "
    "print() every value you need. Read the output before you go on, and fix your code if it "
    "failed. When you are sure, end your last message with the final answer as \\boxed{answer}."
)
DATA_SOURCE = "retool"  # rows converted from tables without a data_source of their own
# ------------------------------------------------------------------------------- reward

def any_failed(tool_calls: Any) -> bool:
    """True when a tool call of the episode did not end "ok" (tinyrl.rollout.base.TOOL_CALL_STATUSES)."""
    return any(call.status != "ok" for call in tool_calls or ())


def compute_score(solution_str: str, ground_truth: Any, answer_format: str = "auto", correct_score: float = 1.0,
                  wrong_score: float = -1.0, timeout_s: float = 5.0, tool_calls: Any = None,
                  tool_error_penalty: float = 0.0) -> float:
    """The maths score of the model's last turn, less `tool_error_penalty` if a tool call failed."""
    score = maths.compute_score(final_turn(solution_str), ground_truth, answer_format, correct_score,
                                wrong_score, timeout_s)
    return score - (tool_error_penalty if any_failed(tool_calls) else 0.0)


def reward(task_cfg: Any) -> RewardFn:
    from tinyrl.data.io import ground_truth

    def score(completion: str, example: Any, episode: Any = None) -> float:
        # An episode that ended in a tool turn (cut by a limit) has no model answer at its end,
        # whatever the tool printed; the text alone cannot always tell (a fake closing marker).
        if episode is not None and episode.turns and episode.turns[-1].role != "assistant":
            completion = ""
        return compute_score(completion, ground_truth(example), task_cfg.answer_format, task_cfg.correct_score,
                             task_cfg.wrong_score, task_cfg.verify_timeout_s,
                             episode.tool_calls if episode is not None else None, task_cfg.tool_error_penalty)
    return score


def extract_answer(completion: str, task_cfg: Any) -> str | None:
    return maths.extract_answer(final_turn(completion), task_cfg)


# ------------------------------------------------------------------------------- RL data

def _user_text(prompt: Any) -> str:
    """The user's message of a verl prompt (a list of messages, or text)."""
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in prompt if m["role"] == "user"]
    return users[-1] if users else ""


def rl_rows(frame: Any, source: str, problem_key: str | None, answer_key: str | None) -> list[tuple[str, str, str]]:
    """(problem, answer, data_source) per row: verl's schema (the problem out of DAPO-Math-17k's
    instruction) or a plain problem/answer table (tinyrl.tasks.math.problem_rows)."""
    from tinyrl.data.io import _plain, ground_truth

    cols = list(frame.columns)
    if not ("prompt" in cols and "reward_model" in cols):
        return [(p, a, DATA_SOURCE) for p, a in maths.problem_rows(frame, source, problem_key, answer_key)]
    out = []
    for row in frame.to_dict("records"):
        text = _user_text(_plain(row["prompt"]))
        truth = maths.cell_text(ground_truth(row))
        if text.strip() and truth:
            out.append((maths.dapo_problem(text) or text.strip(), truth, str(row.get("data_source") or DATA_SOURCE)))
    return out


def prompt_messages(problem: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem.strip()}]


def write_rl(rows: list[tuple[str, str, str]], path: Path, split: str) -> Path:
    import pyarrow as pa

    _write(pa.Table.from_pylist([
        {"data_source": source, "prompt": prompt_messages(problem), "ability": "MATH",
         "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"split": split, "index": i}}
        for i, (problem, answer, source) in enumerate(rows)]), path)
    return path


def convert_rl(source: str, out_dir: Path, name: str | None = None, problem_key: str | None = None,
               answer_key: str | None = None) -> tuple[Path, int, int, int]:
    """Maths rows -> out_dir/NAME.parquet of ReTool prompts. -> (path, rows, duplicates dropped,
    rows without a problem or an answer skipped). Repeated problems are kept once
    (DAPO-Math-17k holds each of its ~17.9k prompts 100 times)."""
    maths.check_name(name)
    frame, default_name = maths.read_table(source)
    usable = rl_rows(frame, source, problem_key, answer_key)
    rows = maths.first_of_each_problem(usable)
    if not rows:
        raise TinyRLError(f"{source}: no row has both a problem and an answer", hint="check the file's columns")
    name = maths.output_name(name, default_name)
    path = write_rl(rows, Path(out_dir).expanduser() / f"{name}.parquet", name)
    return path, len(rows), len(usable) - len(rows), len(frame) - len(usable)


def generate(out_dir, train_size: int, test_size: int, seed: int = 0, template: str = "retool",
             progress: bool = True) -> tuple[Path, Path]:
    """The maths task's generated problems (tinyrl.tasks.math.generated_problems) as ReTool
    prompts: out_dir/train.parquet and test.parquet (tests, and a first look without a download)."""
    out = Path(out_dir).expanduser()
    refuse_existing([out / "train.parquet", out / "test.parquet"], hint=ANOTHER_OUT)  # before any work
    train, test = maths.generated_problems(train_size, test_size, seed)
    return (write_rl([(p, a, DATA_SOURCE) for p, a in train], out / "train.parquet", "train"),
            write_rl([(p, a, DATA_SOURCE) for p, a in test], out / "test.parquet", "test"))


# ------------------------------------------------------------------------------- SFT data

_TAG = re.compile(r"<(code|interpreter|answer)>(.*?)</\1>", re.S)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n?(.*?)```", re.S)
_QUESTION = "*user question:*"  # ReTool-SFT's user message puts its instructions before this


def tool_schemas() -> list[dict]:
    """The OpenAI schemas of TOOLS, as the chat template gets them in SFT and in RL."""
    from tinyrl.tools import TOOLS as REGISTRY

    return [REGISTRY[name].schema for name in TOOLS]


def sft_messages(question: str, reply: str) -> list[dict] | None:
    """One ReTool-SFT trace -> chat messages with tool calls; None when its tags are malformed.

    `reply` is ([prose] <code>program</code> [ws] <interpreter>output</interpreter>)* [prose]
    [<answer>text</answer>]: each <code> becomes an assistant turn calling code_interpreter (the
    prose before it is the turn's content, a ```python fence is removed), each <interpreter> the
    tool turn after it, and the end the final assistant turn (prose + the answer's text, as verl's
    retool_sft_preprocess.py keeps it). The system prompt is the RL prompts' own."""
    if _QUESTION in question:
        question = question.split(_QUESTION, 1)[1]
    question = question.replace("<answer>", "").replace("</answer>", "").strip()
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
    pos, expect_output, answered = 0, False, False
    for m in _TAG.finditer(reply):
        kind, body, before = m.group(1), m.group(2), reply[pos:m.start()]
        pos = m.end()
        if answered or (kind == "interpreter") != expect_output:
            return None  # output without code, code without output, or anything after the answer
        if kind == "code":
            fenced = _FENCE.search(body)
            code = (fenced.group(1) if fenced else body).strip()
            messages.append({"role": "assistant", "content": before.strip(), "tool_calls": [
                {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}]})
        elif kind == "interpreter":
            if before.strip():
                return None
            messages.append({"role": "tool", "content": body.strip()})
        else:
            messages.append({"role": "assistant", "content": (before + body).strip()})
            answered = True
        expect_output = kind == "code"
    rest = reply[pos:].strip()
    if expect_output or (answered and rest) or any(t in rest for t in ("<code>", "<interpreter>", "<answer>")):
        return None
    if not answered:
        if not rest:
            return None  # it ends on a tool's output: no final turn to learn
        messages.append({"role": "assistant", "content": rest})
    return messages


def convert_sft(source: str, out_dir: Path, name: str | None = None, test_size: int = 0,
                messages_key: str = "messages") -> tuple[list[Path], int, int]:
    """ReTool-SFT-style rows -> out_dir/NAME.parquet (+ NAME-test.parquet: the last `test_size`
    rows) with `messages` and `tools` (JSON text). -> (paths, rows written, rows skipped)"""
    import pyarrow as pa

    from tinyrl.data.io import _plain

    maths.check_name(name)
    frame, default_name = maths.read_table(source)
    if messages_key not in frame.columns:
        raise TinyRLError(f"{source}: no {messages_key!r} column (columns: {', '.join(map(str, frame.columns))})",
                          hint="ReTool-SFT rows hold `messages`: the user's question, then one assistant "
                               "message with <code>, <interpreter> and <answer> tags")
    tools = json.dumps(tool_schemas())
    rows, skipped = [], 0
    for raw in frame[messages_key]:
        convo = _plain(raw)
        users = [m.get("content") or "" for m in convo if m.get("role") == "user"]
        replies = [m.get("content") or "" for m in convo if m.get("role") == "assistant"]
        messages = sft_messages(users[0], replies[0]) if len(users) == 1 and len(replies) == 1 else None
        if messages is None:
            skipped += 1
        else:
            rows.append({"messages": messages, "tools": tools})
    if test_size < 0 or test_size >= len(rows):
        raise TinyRLError(f"{source}: {len(rows)} usable rows ({skipped} malformed) cannot spare --test-size {test_size}",
                          hint="give a --test-size below the row count (0 = no test file)")
    name = maths.output_name(name, default_name)
    out = Path(out_dir).expanduser()
    cut = len(rows) - test_size
    parts = [(out / f"{name}.parquet", rows[:cut])] + ([(out / f"{name}-test.parquet", rows[cut:])] if test_size else [])
    refuse_existing([path for path, _ in parts])
    for path, these in parts:
        _write(pa.Table.from_pylist(these), path)
    return [p for p, _ in parts], len(rows), skipped


def _write(table: Any, path: Path) -> None:
    import pyarrow.parquet as pq

    refuse_existing([path])
    try:
        with staged(make_dir(path.parent)) as stage:
            pq.write_table(table, stage / path.name)
    except OSError as e:
        raise TinyRLError(f"cannot write {path}: {e}", hint="check free disk space and permissions") from e


def data_command(
    out_dir: Path = option(..., "--out", help="Output directory."),
    source: Optional[str] = option(None, "--from", help="A file (.parquet/.jsonl/.json/.csv) or hf:NAME[:split] "
                                   "(hf:NAME:CONFIG:SPLIT for a data set with configurations; "
                                   "e.g. hf:BytedTsinghua-SIA/DAPO-Math-17k, or with --sft "
                                   "hf:JoeYing/ReTool-SFT); without it, generated problems (train + test)."),
    sft: bool = option(False, "--sft", help="ReTool-SFT traces -> messages + tools for `tinyrl sft` "
                       "(without it: maths problems -> RL prompts with the ReTool system prompt)."),
    name: Optional[str] = option(None, help="Output file name without .parquet (default: the input's name)."),
    test_size: Optional[int] = option(None, help="With --sft: the last N rows go to NAME-test.parquet "
                                      "(validation loss; default 0); without --from: generated test "
                                      "problems (default 256)."),
    problem_key: Optional[str] = option(None, help="Column holding the problem of a plain table."),
    answer_key: Optional[str] = option(None, help="Column holding the answer of a plain table."),
    train_size: int = option(4096, help="Generated training problems (without --from)."),
    seed: int = option(0, help="Seed of the generated problems."),
) -> None:
    """Convert ReTool-SFT traces (--sft) or maths problems (DAPO-Math-17k, AIME, ...) for the retool task.

    Example (retool-sft-4090's files): tinyrl data retool --sft --from hf:JoeYing/ReTool-SFT --name retool-sft --test-size 64 --out data/retool

    Example (retool-4090's prompts): tinyrl data retool --from hf:BytedTsinghua-SIA/DAPO-Math-17k --name dapo-math-17k --out data/retool
    """
    check_writable(out_dir, lost="nothing was read or written", example="data/retool")  # before a download
    if source is None:
        if sft:
            raise TinyRLError("--sft converts ReTool-SFT traces and needs --from", hint="e.g. --from hf:JoeYing/ReTool-SFT")
        tests = 256 if test_size is None else test_size
        train, test = generate(out_dir, train_size, tests, seed=seed)
        say_wrote(f"wrote {train} ({train_size:,} rows) and {test} ({tests:,} rows)")
        return
    from tinyrl.words import counted

    if sft:
        paths, n, skipped = convert_sft(source, out_dir, name, test_size or 0)
        split = f"{counted(n - (test_size or 0), 'conversation')} + {test_size:,} for the test" if len(paths) > 1 \
            else counted(n, "conversation")
        say_wrote(f"wrote {' and '.join(map(str, paths))} ({split}"
                  + (f"; {counted(skipped, 'malformed row')} skipped" if skipped else "") + ")")
        return
    path, n, dropped, skipped = convert_rl(source, out_dir, name, problem_key, answer_key)
    said = ([f"{counted(dropped, 'repeated row')} kept once"] if dropped else []) + \
        ([maths.skipped_rows(skipped)] if skipped else [])
    say_wrote(f"wrote {path} ({counted(n, 'prompt')}" + "".join(f"; {s}" for s in said) + ")")


def _config_problems(t: Any) -> list[str]:
    out = maths.TASK.config_problems(t)
    if not 0 <= t.tool_error_penalty < t.correct_score - t.wrong_score:
        out.append(f"task.tool_error_penalty = {t.tool_error_penalty} must be >= 0 and below task.correct_score - "
                   f"task.wrong_score = {t.correct_score - t.wrong_score} (so a penalised right answer still "
                   "scores above a wrong one)")
    return out


def _task_line(prompt: str) -> str | None:
    # the rendered prompt: the user's message follows the system prompt (and the tool schemas)
    if SYSTEM_PROMPT not in prompt:
        return None
    return re.split(r"<\|im_end\|>|\nassistant\b", prompt.rsplit("user\n", 1)[-1], maxsplit=1)[0].strip()


TASK = Task(
    name="retool",
    description="Maths with a Python code interpreter (verl's ReTool): \\boxed{} answer of the last turn, "
                "math-verify, +1 / -1, optional tool-error penalty",
    templates=("retool",),
    make_reward=reward,
    solved_at=lambda t: t.correct_score - t.tool_error_penalty,  # a right answer, even with a failed call
    extract_answer=extract_answer,
    data_command=data_command,
    generate=generate,
    # the files retool-4090 and retool-sft-4090 read (README): `tinyrl tasks` shows these whole
    data_hint="`tinyrl data retool --from hf:BytedTsinghua-SIA/DAPO-Math-17k --name dapo-math-17k --out data/retool`",
    sft_data_hint="`tinyrl data retool --sft --from hf:JoeYing/ReTool-SFT --name retool-sft --out data/retool`",
    converts_tables=True,  # maths problems -> RL prompts (--sft reads ReTool-SFT's traces instead)
    task_line=_task_line,
    # answer_patterns: the maths task's (\\boxed{}, "Answer:") already cover this task's answers
    config_problems=_config_problems,
    options=(*maths.OPTIONS, "tool_error_penalty"),
    row_problem=maths.row_problem,
    tools=TOOLS,
    reward_requires=maths.REWARD_REQUIRES,
)
