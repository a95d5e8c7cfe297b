"""Arithmetic with the Python tool: "x=23*47. What is x?" -- the CPU demo where tool use is learned.

The tiny model (tinyrl.tiny_model) cannot multiply two-digit numbers, but it can copy the
question into the program `x=23*47\nprint(x)`, call the `code_interpreter` tool (tinyrl.tools)
in Qwen2.5's hermes format, and copy the tool's output into its answer. So the reward is
reachable only through the tool, and RL can raise accuracy by raising the share of episodes that
use it well. Both copies are laid out for a 2-layer model, which copies by induction (to write
the token after X, find the earlier X and copy what followed it): the program starts with a
verbatim span of the question whose factors follow "=", a token found once in the whole prompt
(tests/test_task_arith.py checks it on the tokenized conversations); the answer holds the number
on its own line as the tool response does. With "What is 23 * 47?" and `print(23 * 47)` the
first factor followed "(", which the question did not have, and the code was right in 9.4% of
the questions after 600 SFT steps; with this layout, in all of them (README: the tool demo).

Data: generated (`tinyrl data arith`), verl's parquet schema: `prompt` = one user message,
`reward_model.ground_truth` = {"a", "b", "product"}. With --sft also sft_train/sft_test.parquet
with `messages` (+ `tools`, the schemas as JSON) for `tinyrl sft`: a share of the rows
(--tool-share) are tool traces (assistant tool call, the tool's real output, the answer), the
rest answer at once with the right number -- which the model cannot compute, so they teach it
to guess, and RL can find that the episodes that call the tool are the ones that score.
Reward: 1 when the final answer (the `<answer>` after the last tool response) is the product,
else 0. Solved: 1. The answer must come from the model's last turn: text a program prints into
a tool response never counts.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from tinyrl.errors import TinyRLError
from tinyrl.rollout.hermes import final_turn
from tinyrl.tasks.base import RewardFn, Task

TOOLS = ("code_interpreter",)
MIN_NUMBER, MAX_NUMBER = 10, 99      # two-digit factors: a product the tiny model cannot guess
TOOL_SHARE = 0.6                     # SFT rows that call the tool (the rest answer at once)
MAX_ROWS = 1_000_000
_QUESTION = "x={a}*{b}. What is x?"
_QUESTION_RE = re.compile(r"x=(\d+)\*(\d+)\. What is x\?")
_ANSWER_RE = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def question(a: int, b: int) -> str:
    return _QUESTION.format(a=a, b=b)


def tool_code(a: int, b: int) -> str:
    """The program a tool trace runs: it starts with the question's own span "x=23*47", so the
    model copies it token by token after the one "=" of the prompt (tests/test_task_arith.py)."""
    return f"x={a}*{b}\nprint(x)"


def tool_call_text(code: str) -> str:
    """An assistant turn calling the Python tool, in hermes format (tinyrl/rollout/hermes.py reads it)."""
    body = json.dumps({"name": "code_interpreter", "arguments": {"code": code}})
    return f"<tool_call>\n{body}\n</tool_call>"


def answer_text(value: int) -> str:
    """The number on its own line, as in the tool response: its digits follow ">" "\\n" in both, so
    the answer can copy the tool's output by induction."""
    return f"<answer>\n{int(value)}\n</answer>"


def extract_answer(completion: str, task_cfg: Any = None) -> str | None:
    found = _ANSWER_RE.findall(final_turn(completion))
    return found[-1] if found else None


def reward() -> RewardFn:
    def score(completion: str, example: Any) -> float:
        answer = extract_answer(completion)
        truth = example["reward_model"]["ground_truth"]
        return 1.0 if answer is not None and int(answer) == int(truth["product"]) else 0.0
    return score


# ------------------------------------------------------------------------------- data

def _pairs(rng: random.Random, size: int, exclude: set) -> list[tuple[int, int]]:
    out = []
    while len(out) < size:
        pair = (rng.randint(MIN_NUMBER, MAX_NUMBER), rng.randint(MIN_NUMBER, MAX_NUMBER))
        if pair not in exclude:
            out.append(pair)
    return out


def tool_outputs(codes: list[str]) -> list[str]:
    """Each program's tool turn text (tinyrl.tools.render of its run), from ONE sandboxed run
    that executes every program on its own stdout: thousands of rows in a second instead of
    one sandbox start (~0.15 s) each. The same interpreter and sandbox as the tool; a test
    checks rows against separate run_code calls."""
    from tinyrl.tools import render, run_code

    if not codes:
        return []
    driver = ("import contextlib, io, json\nout = []\n"
              f"for code in json.loads({json.dumps(json.dumps(codes))}):\n"
              "    buf = io.StringIO()\n"
              "    with contextlib.redirect_stdout(buf):\n"
              "        exec(code, {})\n"
              "    out.append(buf.getvalue())\n"
              "print(json.dumps(out))\n")
    result = run_code(driver, timeout_s=120.0, memory_mb=1024, max_output_bytes=64 * len(codes) + 1024)
    if not result.ok:
        raise TinyRLError(f"the Python sandbox could not run the SFT traces' programs: {result.message}",
                          hint=f"check that `tinyrl.tools.run_code('print(1)')` works here; stderr: {result.stderr[-300:]}")
    stdouts = json.loads(result.stdout)
    # the same text a separate call's render gives: exit 0, nothing on stderr, not truncated
    return [render(replace(result, stdout=s, stderr="", truncated=False)) for s in stdouts]


def _prompt_table(pairs: list[tuple[int, int]], split: str):
    import pyarrow as pa

    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": question(a, b)}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": {"a": a, "b": b, "product": a * b}},
             "extra_info": {"split": split, "index": i}} for i, (a, b) in enumerate(pairs)]
    return pa.Table.from_pylist(rows)


def sft_messages(a: int, b: int, use_tool: bool, output: str = "") -> list[dict]:
    """One SFT conversation: a tool trace (call, the tool's output, the answer) or a direct answer."""
    user = {"role": "user", "content": question(a, b)}
    if not use_tool:
        return [user, {"role": "assistant", "content": answer_text(a * b)}]
    return [user, {"role": "assistant", "content": tool_call_text(tool_code(a, b))},
            {"role": "tool", "content": output},
            {"role": "assistant", "content": answer_text(int(output))}]


def _sft_table(table, pairs: list[tuple[int, int]], rng: random.Random, tool_share: float):
    import pyarrow as pa

    from tinyrl.tools import TOOLS as REGISTRY

    use = [rng.random() < tool_share for _ in pairs]
    outputs = iter(tool_outputs([tool_code(a, b) for (a, b), u in zip(pairs, use) if u]))
    messages = [sft_messages(a, b, u, next(outputs) if u else "") for (a, b), u in zip(pairs, use)]
    schemas = json.dumps([REGISTRY[name].schema for name in TOOLS])
    return (table.append_column("messages", pa.array(messages))
            .append_column("tools", pa.array([schemas] * len(pairs), pa.string())))


def generate(out_dir, train_size: int, test_size: int, seed: int = 0, template: str = "chat",
             progress: bool = True, sft: bool = False, tool_share: float = TOOL_SHARE) -> tuple[Path, Path]:
    """train.parquet and test.parquet under out_dir (train skips every test pair); with `sft`,
    also sft_train/sft_test.parquet (the same rows with `messages` and `tools`)."""
    import pyarrow.parquet as pq

    for name, size in (("train_size", train_size), ("test_size", test_size)):
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_ROWS:
            raise TinyRLError(f"{name} must be an integer from 1 to {MAX_ROWS:,}, got {size!r}",
                              hint="e.g. --train-size 8192 --test-size 1024")
    if not 0.0 <= tool_share <= 1.0:
        raise TinyRLError(f"--tool-share {tool_share} is not a share from 0 to 1",
                          hint="e.g. --tool-share 0.3: 30% of the SFT rows call the tool")
    out = Path(out_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TinyRLError(f"cannot create {out}: {e}", hint="choose a writable output directory") from e
    test = _pairs(random.Random(f"tinyrl-arith:{seed}:test"), test_size, set())
    train = _pairs(random.Random(f"tinyrl-arith:{seed}:train"), train_size, set(test))
    paths = out / "train.parquet", out / "test.parquet"
    try:
        for path, pairs, split in ((paths[0], train, "train"), (paths[1], test, "test")):
            table = _prompt_table(pairs, split)
            pq.write_table(table, path, compression="zstd")
            if sft:
                rng = random.Random(f"tinyrl-arith:{seed}:{split}:tool-share")
                pq.write_table(_sft_table(table, pairs, rng, tool_share), out / f"sft_{path.name}",
                               compression="zstd")
    except OSError as e:
        raise TinyRLError(f"cannot write arith data to {out}: {e}", hint="check free disk space and permissions") from e
    return paths


def generate_sft(out_dir, train_size: int, test_size: int, seed: int = 0, template: str = "chat",
                 progress: bool = True, **options) -> tuple[Path, Path]:
    train, test = generate(out_dir, train_size, test_size, seed=seed, template=template, sft=True, **options)
    return train.with_name("sft_train.parquet"), test.with_name("sft_test.parquet")


def data_command(
    out_dir: Path = typer.Option(..., "--out", help="Directory for train.parquet and test.parquet."),
    train_size: int = typer.Option(8192, help="Training questions."),
    test_size: int = typer.Option(1024, help="Test questions (train skips every one of them)."),
    seed: int = typer.Option(0, help="Random seed; the same seed gives the same files."),
    sft: bool = typer.Option(False, "--sft", help="Also write sft_train.parquet and sft_test.parquet: the same "
                             "questions as conversations (`messages`, `tools`) for `tinyrl sft`."),
    tool_share: float = typer.Option(TOOL_SHARE, help="With --sft: the share of conversations that call the "
                                     "Python tool; the others answer at once."),
) -> None:
    """Write 'x=a*b. What is x?' questions (two-digit factors) for the Python-tool task."""
    from rich.console import Console

    train, test = generate(out_dir, train_size, test_size, seed=seed, sft=sft, tool_share=tool_share)
    Console().print(f"wrote {train} ({train_size:,} rows) and {test} ({test_size:,} rows)")
    if sft:
        Console().print(f"wrote {train.with_name('sft_train.parquet')} and {test.with_name('sft_test.parquet')} "
                        f"({tool_share:.0%} of the conversations call the tool, for `tinyrl sft`)")


def _task_line(prompt: str) -> str | None:
    match = _QUESTION_RE.search(prompt)
    return match.group(0) if match else None


TASK = Task(
    name="arith",
    description="'x=a*b. What is x?' with the Python tool (code_interpreter); answer in <answer></answer>; 1 / 0",
    templates=("chat",),
    make_reward=lambda t: reward(),
    solved_at=lambda t: 1.0,
    extract_answer=extract_answer,
    data_command=data_command,
    generate=generate,
    generate_sft=generate_sft,
    data_hint="`tinyrl data arith --out DIR`",
    task_line=_task_line,
    answer_patterns=(r"<answer>\s*-?\d+\s*</answer>",),
    tools=TOOLS,
)
