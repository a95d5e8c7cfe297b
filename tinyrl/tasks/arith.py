"""Arithmetic with the Python tool: "a=23, b=46. What is a*b%7?" -- the CPU demo where tool use is learned.

The tiny model (tinyrl.tiny_model) cannot compute the remainder of a product of two-digit
numbers, but the question's values are loaded in the Python tool's interpreter (the episode's
`setup`, verl's per-row tools_kwargs: tinyrl.tools), so the program `print(a*b%7)` answers it:
the model calls the `code_interpreter` tool (tinyrl.tools) in Qwen2.5's hermes format and copies
its one-digit output into its answer. No factor is a multiple of 7, so the answer is one of 1-6,
each equally often: a guess is right 1 time in 6, the tool every time. RL can raise the accuracy
by raising the share of episodes that use the tool.

Why this layout (README: the tool demo, measured): the 2-layer tiny model copies one digit that
follows a fixed anchor reliably, and neither a program that copies the question's numbers nor a
multi-digit answer copied from the tool's output was learned next to the other in 600 SFT steps
(with the values in the program, "x=23*47", the program copy came only after a restart, and then
the answer's digits after the first stayed at chance).

Data: generated (`tinyrl data arith`), verl's parquet schema: `prompt` = one user message,
`reward_model.ground_truth` = {"a", "b", "answer"}, `extra_info.tools_kwargs` = the Python tool's
setup ("a=23\nb=46"). With --sft also sft_train/sft_test.parquet with `messages` (+ `tools`, the
schemas as JSON) for `tinyrl sft`: a share of the rows (--drill-share, half) are drills, the
tool's output and the answer that copies it with nothing around them (see _sft_table); of the
others a share (--tool-share) are tool traces (assistant tool call, the tool's real output, the
answer), the rest answer at once with the right number -- which the model cannot compute, so
they teach it to guess, and RL can find that the episodes that call the tool are the ones that
score. Reward: 1 when the final answer (the `<answer>`
after the last tool response) is right, else 0. Solved: 1. The answer must come from the model's
last turn: text a program prints into a tool response never counts.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from tinyrl.errors import TinyRLError
from tinyrl.rollout.hermes import final_turn
from tinyrl.tasks.base import RewardFn, Task, option, say_wrote
from tinyrl.writable import ANOTHER_OUT, make_dir, refuse_existing, staged

TOOLS = ("code_interpreter",)
MIN_NUMBER, MAX_NUMBER = 10, 99      # two-digit factors: a remainder the tiny model cannot compute
MODULUS = 7                          # factors are never multiples of it: answers 1-6, uniform
TOOL_SHARE = 0.4                     # SFT conversations (drills aside) that call the tool; the rest answer at once
DRILL_SHARE = 0.5                    # SFT rows that are drills: a tool's output and the answer copying it, alone
MAX_ROWS = 1_000_000
TOOL_CODE = f"print(a*b%{MODULUS})"  # every tool trace's program: the values are in the setup
_QUESTION = "a={a}, b={b}. What is a*b%" + str(MODULUS) + "?"
_QUESTION_RE = re.compile(r"a=(\d+), b=(\d+)\. What is a\*b%" + str(MODULUS) + r"\?")
_ANSWER_RE = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def question(a: int, b: int) -> str:
    return _QUESTION.format(a=a, b=b)


def solution(a: int, b: int) -> int:
    return a * b % MODULUS


def setup_code(a: int, b: int) -> str:
    """The Python tool's setup for this question (run before each of its calls in the episode)."""
    return f"a={a}\nb={b}"


def row_tools_kwargs(a: int, b: int) -> dict:
    """verl's extra_info.tools_kwargs for a row: the Python tool's create_kwargs."""
    return {"code_interpreter": {"create_kwargs": {"setup": setup_code(a, b)}}}


def tool_call_text(code: str) -> str:
    """An assistant turn calling the Python tool, in hermes format (tinyrl/rollout/hermes.py reads it)."""
    body = json.dumps({"name": "code_interpreter", "arguments": {"code": code}})
    return f"<tool_call>\n{body}\n</tool_call>"


def answer_text(value: int) -> str:
    """The number on its own line, as in the tool response: its digit follows ">" "\\n" in both."""
    return f"<answer>\n{int(value)}\n</answer>"


def extract_answer(completion: str, task_cfg: Any = None) -> str | None:
    found = _ANSWER_RE.findall(final_turn(completion))
    return found[-1] if found else None


def row_problem(row: Any) -> str | None:
    try:
        int(row["reward_model"]["ground_truth"]["answer"])  # as the reward reads it
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        return (f"reward_model.ground_truth has no integer answer ({type(exc).__name__}: {exc}); "
                "it is {'a', 'b', 'answer'}")
    return None


def reward() -> RewardFn:
    def score(completion: str, example: Any) -> float:
        answer = extract_answer(completion)
        truth = example["reward_model"]["ground_truth"]
        return 1.0 if answer is not None and int(answer) == int(truth["answer"]) else 0.0
    return score


# ------------------------------------------------------------------------------- data

def _pairs(rng: random.Random, size: int, exclude: set) -> list[tuple[int, int]]:
    out = []
    while len(out) < size:
        pair = (rng.randint(MIN_NUMBER, MAX_NUMBER), rng.randint(MIN_NUMBER, MAX_NUMBER))
        if pair not in exclude and pair[0] % MODULUS and pair[1] % MODULUS:
            out.append(pair)
    return out


def tool_outputs(runs: list[tuple[str, str]]) -> list[str]:
    """Each (setup, program)'s tool turn text (tinyrl.tools.render of its run), from ONE sandboxed
    run that executes every setup and program in a namespace of its own, on its own stdout:
    thousands of rows in a second instead of one sandbox start (~0.15 s) each. The same
    interpreter and sandbox as the tool; a test checks rows against separate tool calls."""
    from tinyrl.tools import render, run_code

    if not runs:
        return []
    driver = ("import contextlib, io, json\nout = []\n"
              f"for setup, code in json.loads({json.dumps(json.dumps(runs))}):\n"
              "    buf, space = io.StringIO(), {}\n"
              "    with contextlib.redirect_stdout(buf):\n"
              "        exec(setup, space)\n"
              "        exec(code, space)\n"
              "    out.append(buf.getvalue())\n"
              "print(json.dumps(out))\n")
    result = run_code(driver, timeout_s=120.0, memory_mb=1024, max_output_bytes=64 * len(runs) + 1024)
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
             "reward_model": {"style": "rule", "ground_truth": {"a": a, "b": b, "answer": solution(a, b)}},
             "extra_info": {"split": split, "index": i, "tools_kwargs": row_tools_kwargs(a, b)}}
            for i, (a, b) in enumerate(pairs)]
    return pa.Table.from_pylist(rows)


def sft_messages(a: int, b: int, kind: str, output: str = "") -> list[dict]:
    """One SFT conversation of a `kind`: "direct" (the answer at once), "tool" (a tool trace: call,
    the tool's output, the answer) or "drill" (the tool's output and the answer alone, no question
    and no tool list: 49 tokens instead of ~310)."""
    user = {"role": "user", "content": question(a, b)}
    if kind == "direct":
        return [user, {"role": "assistant", "content": answer_text(solution(a, b))}]
    answer = {"role": "assistant", "content": answer_text(int(output))}
    if kind == "drill":
        return [{"role": "tool", "content": output}, answer]
    return [user, {"role": "assistant", "content": tool_call_text(TOOL_CODE)}, {"role": "tool", "content": output}, answer]


def _sft_table(table, pairs: list[tuple[int, int]], rng: random.Random, tool_share: float, drill_share: float):
    """Why drills: a 2-layer model learns to read the tool's output into its answer late or never in
    full conversations, where the output is one token among ~310 (on one CPU by SFT step 100; on
    an AVX-512 one, from the same settings, at step 250 in one run of four, partly (37%) at step
    500 in another, not in 500 and 1,200 steps in two). With half the rows 49-token drills it
    formed (teacher-forced, held-back tool conversations) by step 50-100 in 4 runs of 5 and
    reached 84% in the fifth (README: the tool demo)."""
    import pyarrow as pa

    from tinyrl.tools import TOOLS as REGISTRY

    kinds = ["drill" if rng.random() < drill_share else "tool" if rng.random() < tool_share else "direct"
             for _ in pairs]
    outputs = iter(tool_outputs([(setup_code(a, b), TOOL_CODE) for (a, b), k in zip(pairs, kinds) if k != "direct"]))
    messages = [sft_messages(a, b, k, "" if k == "direct" else next(outputs)) for (a, b), k in zip(pairs, kinds)]
    schemas = json.dumps([REGISTRY[name].schema for name in TOOLS])
    tools = ["[]" if k == "drill" else schemas for k in kinds]  # a drill lists no tools: no system prompt
    return (table.append_column("messages", pa.array(messages))
            .append_column("tools", pa.array(tools, pa.string())))


def generate(out_dir, train_size: int, test_size: int, seed: int = 0, template: str = "chat",
             progress: bool = True, sft: bool = False, tool_share: float = TOOL_SHARE,
             drill_share: float = DRILL_SHARE) -> tuple[Path, Path]:
    """train.parquet and test.parquet under out_dir (train skips every test pair); with `sft`,
    also sft_train/sft_test.parquet (the same rows with `messages` and `tools`: drill_share of
    them drills, tool_share of the others tool traces, the rest direct answers)."""
    import pyarrow.parquet as pq

    for name, size in (("train_size", train_size), ("test_size", test_size)):
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_ROWS:
            raise TinyRLError(f"{name} must be an integer from 1 to {MAX_ROWS:,}, got {size!r}",
                              hint="e.g. --train-size 8192 --test-size 1024")
    for flag, share in (("--tool-share", tool_share), ("--drill-share", drill_share)):
        if not 0.0 <= share <= 1.0:
            raise TinyRLError(f"{flag} {share} is not a share from 0 to 1",
                              hint=f"e.g. {flag} 0.3: 30% of the SFT rows")
    out = make_dir(Path(out_dir).expanduser())
    paths = out / "train.parquet", out / "test.parquet"
    refuse_existing([*paths, *((out / f"sft_{p.name}" for p in paths) if sft else ())], hint=ANOTHER_OUT)
    test = _pairs(random.Random(f"tinyrl-arith:{seed}:test"), test_size, set())
    train = _pairs(random.Random(f"tinyrl-arith:{seed}:train"), train_size, set(test))
    try:
        with staged(out) as stage:  # an interrupted run leaves no half-written file
            for path, pairs, split in ((paths[0], train, "train"), (paths[1], test, "test")):
                table = _prompt_table(pairs, split)
                pq.write_table(table, stage / path.name, compression="zstd")
                if sft:
                    rng = random.Random(f"tinyrl-arith:{seed}:{split}:tool-share")
                    pq.write_table(_sft_table(table, pairs, rng, tool_share, drill_share), stage / f"sft_{path.name}",
                                   compression="zstd")
    except OSError as e:
        raise TinyRLError(f"cannot write arith data to {out}: {e}", hint="check free disk space and permissions") from e
    return paths


def generate_sft(out_dir, train_size: int, test_size: int, seed: int = 0, template: str = "chat",
                 progress: bool = True, **options) -> tuple[Path, Path]:
    train, test = generate(out_dir, train_size, test_size, seed=seed, template=template, sft=True, **options)
    return train.with_name("sft_train.parquet"), test.with_name("sft_test.parquet")


def data_command(
    out_dir: Path = option(..., "--out", help="Directory for train.parquet and test.parquet."),
    train_size: int = option(8192, help="Training questions."),
    test_size: int = option(1024, help="Test questions (train skips every one of them)."),
    seed: int = option(0, help="Random seed; the same seed gives the same files."),
    sft: bool = option(False, "--sft", help="Also write sft_train.parquet and sft_test.parquet: the same "
                       "questions as conversations (`messages`, `tools`) for `tinyrl sft`."),
    tool_share: float = option(TOOL_SHARE, help="With --sft: the share of conversations (drills aside) "
                               "that call the Python tool; the others answer at once."),
    drill_share: float = option(DRILL_SHARE, help="With --sft: the share of rows that are drills, a tool's "
                                "output and the answer that copies it alone, which teach the tiny model to "
                                "read the tool's output."),
) -> None:
    """Write 'a=23, b=46. What is a*b%7?' questions (two-digit factors) for the Python-tool task.

    Example (+ the tool demo's SFT conversations): tinyrl data arith --out data/arith --sft
    """
    train, test = generate(out_dir, train_size, test_size, seed=seed, sft=sft, tool_share=tool_share,
                           drill_share=drill_share)
    say_wrote(f"wrote {train} ({train_size:,} rows) and {test} ({test_size:,} rows)")
    if sft:
        say_wrote(f"wrote {train.with_name('sft_train.parquet')} and {test.with_name('sft_test.parquet')} "
                  f"({drill_share:.0%} of the rows drills; of the others {tool_share:.0%} call the tool; "
                  "for `tinyrl sft`)")


def _task_line(prompt: str) -> str | None:
    match = _QUESTION_RE.search(prompt)
    return match.group(0) if match else None


TASK = Task(
    name="arith",
    description="'a=23, b=46. What is a*b%7?' with the values in the Python tool (code_interpreter); "
                "answer in <answer></answer>; 1 / 0",
    templates=("chat",),
    make_reward=lambda t: reward(),
    row_problem=row_problem,
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
