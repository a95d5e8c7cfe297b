"""The task registry: `tinyrl tasks` lists it, `task.name` picks one.

Adding a task = one module here that builds a `Task` (tinyrl/tasks/base.py) named TASK, one
line in _MODULES, and a preset. Task modules import heavy libraries (math-verify, datasets)
lazily, so listing tasks stays fast.
"""

from __future__ import annotations

import difflib
import importlib
import re
from functools import cache

from tinyrl.errors import TinyRLError
from tinyrl.tasks.base import RewardFn, Task

__all__ = ["RewardFn", "Task", "all_tasks", "check_rows", "get_task", "option_unread", "task_problems", "template_of", "task_line", "answer_patterns"]

_MODULES = ("countdown", "math", "retool", "arith")


@cache
def all_tasks() -> dict[str, Task]:
    return {name: importlib.import_module(f"tinyrl.tasks.{name}").TASK for name in _MODULES}


def get_task(name: str) -> Task:
    tasks = all_tasks()
    if name not in tasks:
        near = difflib.get_close_matches(name, tasks, n=1)
        raise TinyRLError(f"unknown task {name!r}", hint=(f"did you mean {near[0]!r}? " if near else "")
                          + f"tasks: {', '.join(tasks)} (`tinyrl tasks`)")
    return tasks[name]


def check_rows(task: Task, rows: list, path) -> None:
    """Every row's ground truth as the task's reward reads it, before anything is generated: a
    file of another task's data failed after a whole rollout or evaluation (Countdown's reward on
    maths rows) or was scored 0 without a word (maths on Countdown's {"target", "numbers"})."""
    bad = [(i, why) for i, row in enumerate(rows) if (why := task.row_problem(row))]
    if not bad:
        return
    first, why = bad[0]
    source = rows[first].get("data_source")  # rows are records (load_prompts(...).to_dict("records"))
    raise TinyRLError(f"{path}: {len(bad):,} of {len(rows):,} rows cannot be scored by the {task.name} task's reward "
                      f"(first at row {first}, counting from 0: {why})",
                      hint=(f"their data_source is {source!r}: " if source else "")
                      + "if the file is another task's data, set that task (task.name, or eval's --task; "
                      "`tinyrl tasks`); else fix those rows' reward_model.ground_truth")


def task_problems(cfg) -> list[str]:
    """The [task] section's problems, each saying what to set (called by config.problems_of)."""
    tasks = all_tasks()
    t = cfg.task
    if t.name not in tasks:
        near = difflib.get_close_matches(t.name, tasks, n=1)
        return [f"task.name = {t.name!r} is not one of {', '.join(tasks)}"
                + (f" (did you mean {near[0]!r}?)" if near else "")]
    task = tasks[t.name]
    out = []
    if t.template and t.template not in task.templates:
        out.append(f"task.template = {t.template!r} is not a template of the {t.name} task; "
                   f"choose one of {', '.join(task.templates)}")
    if task.tools:  # episodes with tools: the template lists the tools and writes the tool turns
        from tinyrl.tools import TOOLS

        unknown = [name for name in task.tools if name not in TOOLS]
        if unknown:
            out.append(f"the {t.name} task offers tool(s) {', '.join(unknown)} that tinyrl does not have "
                       f"(tools: {', '.join(TOOLS)})")
        if not cfg.data.chat_template:
            out.append(f"the {t.name} task calls tools, so its prompts must go through the chat template: "
                       "set data.chat_template=true (and model.custom_chat_template when the tokenizer has none)")
    return out + task.config_problems(t)


def option_unread(cfg, key: str) -> str | None:
    """Why no task of this run (its task, and tasks used as reward functions) reads the [task]
    option `key`; None when one does (config.unread_setting_notes says the why)."""
    tasks = all_tasks()
    if cfg.task.name not in tasks:
        return None  # an unknown task is a problem of its own
    used = [cfg.task.name] + [s for s in [cfg.reward.fn, *cfg.reward.extra_fns] if s in tasks]
    if any(key in tasks[name].options for name in used):
        return None
    readers = [name for name, task in tasks.items() if key in task.options]
    own = ", ".join(tasks[cfg.task.name].options) or "none"
    return (f"it is not an option of the {cfg.task.name} task (its options: {own})"
            + (f"; {' and '.join(readers)} {'reads' if len(readers) == 1 else 'read'} it" if readers else ""))


def data_hint(cfg) -> str:
    """How to make the file the run's command reads: the task's RL data, or its SFT data."""
    task = get_task(cfg.task.name)
    if cfg.command != "sft":
        return task.data_hint
    return task.sft_data_hint or task.data_hint.replace(" --out DIR`", " --sft --out DIR`")


def template_of(task_cfg) -> str:
    """task.template, or the task's first template when it is unset."""
    return task_cfg.template or get_task(task_cfg.name).templates[0]


def task_line(prompt: str) -> str:
    """The part of a prompt that says what this sample is about (the dashboard's sample line)."""
    for task in all_tasks().values():
        line = task.task_line(prompt)
        if line:
            return " ".join(line.split())
    return " ".join(prompt.split())


@cache
def answer_patterns() -> re.Pattern:
    """One regex matching every task's answer span (highlighted by the dashboard)."""
    return re.compile("|".join(f"(?:{p})" for t in all_tasks().values() for p in t.answer_patterns), re.S)
