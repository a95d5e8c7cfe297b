"""Countdown (TinyZero): reach a target with +, -, *, / using each given number once.

Data: generated, every task solvable (tinyrl.data.countdown), TinyZero's parquet schema with
ground_truth = {"target": int, "numbers": [int, ...]}; TinyZero's own files load as they are.
Templates: base | qwen-instruct (tinyrl.data.templates). Reward: TinyZero's 0 / format_score / 1
(tinyrl.rewards.countdown.compute_score, which stays importable for verl configs). Solved: a
score of 1 (the full score).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tinyrl.errors import TinyRLError
from tinyrl.tasks.base import RewardFn, Task, option, say_wrote

_TASK_LINE = re.compile(r"Using the numbers .*?equals -?\d+", re.S)  # the part that differs per task


def reward(format_score: float = 0.1, strict: bool = False) -> RewardFn:
    from tinyrl.rewards import countdown

    if not strict:
        def score(completion: str, example: Any) -> float:
            return countdown.compute_score(
                completion, example["reward_model"]["ground_truth"], format_score=format_score)
        return score

    from tinyrl.data.io import first_message_text

    # TinyZero scores the decoded prompt + response, cutting at the first "Assistant:".
    def strict_score(completion: str, example: Any) -> float:
        return countdown.compute_score(
            first_message_text(example) + completion, example["reward_model"]["ground_truth"],
            strict=True, format_score=format_score)
    return strict_score


def row_problem(row: Any) -> str | None:
    """The reward's own reading of the ground truth ({"target": int, "numbers": [int, ...]})."""
    from tinyrl.rewards.countdown import unpack_truth

    try:
        unpack_truth(row["reward_model"]["ground_truth"])
    except (KeyError, TypeError) as exc:
        return f"no reward_model.ground_truth ({type(exc).__name__}: {exc})"
    except TinyRLError as exc:
        return exc.message
    return None


def extract_answer(completion: str, task_cfg: Any = None) -> str | None:
    from tinyrl.rewards.countdown import last_answer

    found = last_answer(completion)
    return None if found is None else found.strip()


def generate(out_dir, train_size: int, test_size: int, seed: int = 0, template: str = "base",
             progress: bool = True, sft: bool = False, **options) -> tuple[Path, Path]:
    """`options`: operands, max_number (the easier settings, see `_generate_options`)."""
    from tinyrl.data.countdown import generate_countdown

    return generate_countdown(out_dir, train_size, test_size, seed=seed, template=template, progress=progress,
                              sft=sft, **options)


def generate_sft(out_dir, train_size: int, test_size: int, seed: int = 0, template: str = "base",
                 progress: bool = True, **options) -> tuple[Path, Path]:
    """The same tasks with reference responses: -> (sft_train.parquet, sft_test.parquet)."""
    train, test = generate(out_dir, train_size, test_size, seed=seed, template=template, progress=progress, sft=True,
                           **options)
    return train.with_name("sft_train.parquet"), test.with_name("sft_test.parquet")


def _generate_options(t: Any) -> dict:
    return {"operands": tuple(t.operands), "max_number": t.max_number}


def _config_problems(t: Any) -> list[str]:
    from tinyrl.data.countdown import option_problems

    return option_problems(t.operands, t.max_number)


def _operand_counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise TinyRLError(f"--operands {text!r} is not a comma-separated list of integers",
                          hint="e.g. --operands 3,4 (TinyZero) or --operands 2,3") from e


def data_command(
    out_dir: Path = option(..., "--out", help="Directory for train.parquet and test.parquet."),
    train_size: int = option(327_680, help="Training tasks (TinyZero: 327,680)."),
    test_size: int = option(1_024, help="Test tasks (TinyZero: 1,024)."),
    seed: int = option(0, help="Random seed; the same seed gives the same files."),
    template: str = option("base", help="Prompt template: base | qwen-instruct."),
    operands: str = option("3,4", help="Numbers per task, one count drawn per task (TinyZero: 3,4)."),
    max_number: int = option(100, help="Largest number in a task (TinyZero: 100)."),
    sft: bool = option(False, "--sft", help="Also write sft_train.parquet and sft_test.parquet: the same "
                       "tasks with a `response` column, the reference solution in the answer format "
                       "(for `tinyrl sft`)."),
) -> None:
    """Write Countdown tasks in TinyZero's parquet schema (every task solvable).

    Example (TinyZero's sizes): tinyrl data countdown --out data/cd

    Example (easier tasks, + SFT files): tinyrl data countdown --out data/easy --operands 2,3 --max-number 20 --sft
    """
    from tinyrl.data.countdown import MAX_ROWS

    if not (1 <= train_size <= MAX_ROWS and 1 <= test_size <= MAX_ROWS):
        raise TinyRLError(f"--train-size and --test-size must be between 1 and {MAX_ROWS:,} "
                          f"(got {train_size:,} and {test_size:,})",
                          hint="TinyZero uses --train-size 327680 --test-size 1024")
    from tinyrl.data.countdown import option_problems
    from tinyrl.data.templates import TEMPLATES

    counts = _operand_counts(operands)
    # said with this command's flags, all at once (the generator's own words are the config's, task.operands)
    problems = ([f"--template {template!r} is not a template: choose one of {', '.join(TEMPLATES)}"]
                if template not in TEMPLATES else [])
    problems += option_problems(counts, max_number, flags=True)
    if problems:
        raise TinyRLError("; ".join(problems) + "; nothing was written",
                          hint="e.g. --template base --operands 2,3 --max-number 20")
    train, test = generate(out_dir, train_size, test_size, seed=seed, template=template, sft=sft,
                           operands=counts, max_number=max_number)
    say_wrote(f"wrote {train} ({train_size:,} rows) and {test} ({test_size:,} rows)")
    if sft:
        say_wrote(f"wrote {train.with_name('sft_train.parquet')} and {test.with_name('sft_test.parquet')} "
                  "(the same tasks with reference responses, for `tinyrl sft`)")


def _task_line(prompt: str) -> str | None:
    match = _TASK_LINE.search(prompt)
    return match.group(0) if match else None


TASK = Task(
    name="countdown",
    description="TinyZero's Countdown: numbers and a target, answer in <answer></answer>; 1 / 0.1 / 0",
    templates=("base", "qwen-instruct"),
    make_reward=lambda t: reward(t.format_score, t.strict),
    solved_at=lambda t: 1.0,
    extract_answer=extract_answer,
    data_command=data_command,
    generate=generate,
    generate_sft=generate_sft,
    data_hint="`tinyrl data countdown --out DIR`",
    task_line=_task_line,
    answer_patterns=(r"<answer>.*?</answer>",),
    config_problems=_config_problems,
    options=("format_score", "strict", "operands", "max_number"),
    row_problem=row_problem,
    generate_options=_generate_options,
)
