"""What a task is: everything task-specific behind one small record (see tinyrl/tasks/__init__.py).

A task owns its data (generate or convert, and the parquet schema it expects), its prompt
templates, its reward `(completion, row) -> float`, what counts as solved, and how a sample
reads on the dashboard. Everything else (trainer, engines, eval) only talks to this record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

RewardFn = Callable[[str, Any], float]     # (completion text, dataset row) -> score


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    templates: tuple[str, ...]                          # task.template choices (the first is the default)
    make_reward: Callable[[Any], RewardFn]              # TaskConfig -> reward function
    solved_at: Callable[[Any], float]                   # TaskConfig -> a score >= this is "solved"
    extract_answer: Callable[[str, Any], str | None]    # (completion, TaskConfig) -> the answer it gives
    data_command: Callable[..., None]                   # `tinyrl data NAME ...` (a typer command)
    # (out_dir, train_size, test_size, seed, template) -> (train, test); None: nothing to generate
    generate: Callable[..., tuple[Path, Path]] | None = None
    # the same, for `tinyrl sft`: rows with a reference `response` -> (sft train, sft test)
    generate_sft: Callable[..., tuple[Path, Path]] | None = None
    data_hint: str = ""                                 # how to make data when the file is missing
    # `tinyrl data NAME --from FILE` turns a plain table of problems and answers (.jsonl, .csv,
    # ...) into the task's prompts: said to the owner of such a table given as data (table_hint)
    converts_tables: bool = False
    # the same for `tinyrl sft`'s file; "": data_hint + --sft when generate_sft is set, else what an
    # SFT file of the user's must hold (tinyrl.tasks._sft_hint)
    sft_data_hint: str = ""
    task_line: Callable[[str], str | None] = lambda prompt: None   # the line of a prompt worth showing
    answer_patterns: tuple[str, ...] = field(default=())           # regexes of the answer span (dashboard)
    config_problems: Callable[[Any], list[str]] = lambda task_cfg: []
    # The [task] options it reads besides name and template: another task's option given for
    # this task is said at the start of a run, not silently ignored (tinyrl.tasks.option_unread)
    options: tuple[str, ...] = ()
    # A data row -> why the task's reward cannot read its reward_model.ground_truth (None: it can),
    # checked for every row before anything is generated (tinyrl.tasks.check_rows)
    row_problem: Callable[[Any], str | None] = lambda row: None
    # TaskConfig -> keyword arguments for `generate` (the task's own data options)
    generate_options: Callable[[Any], dict] = lambda task_cfg: {}
    # Tools the model may call (names in tinyrl.tools.TOOLS). Non-empty: prompts are rendered by
    # the chat template with these schemas, and rollouts are episodes of turns (rollout/turns.py).
    tools: tuple[str, ...] = ()
    # What the reward needs besides tinyrl's own code (pip requirements, as pyproject.toml pins
    # them): where verl runs, tinyrl is installed without its dependencies (export-verl)
    reward_requires: tuple[str, ...] = ()


def say_wrote(line: str) -> None:
    """A `tinyrl data NAME` command's "wrote PATH (...)" line, one line however narrow the terminal:
    a path that rich wrapped at the console's width could not be copied whole, and one with [brackets]
    lost them as markup."""
    from rich.console import Console

    Console().print(line, soft_wrap=True, highlight=False, markup=False)


def option(default: Any, *flags: str, **kwargs: Any) -> Any:
    """typer.Option, for the parameters of a task's `tinyrl data NAME` command. Where typer is not
    installed (tinyrl installed with --no-deps beside verl, for export-verl's reward_fn.py: README,
    "When one GPU is not enough") no command is ever built, and the plain default stands in, so
    the task modules (and their rewards) still import."""
    try:
        import typer
    except ImportError:
        return default
    return typer.Option(default, *flags, **kwargs)

