"""The task registry: `tinyrl tasks` lists it, `task.name` picks one.

Adding a task = one module here that builds a `Task` (tinyrl/tasks/base.py) named TASK, one
line in _MODULES, and a preset. Task modules import heavy libraries (math-verify, datasets)
lazily, so listing tasks stays fast.
"""

from __future__ import annotations

import difflib
import importlib
import re
import shlex
from functools import cache
from pathlib import Path

from tinyrl.errors import TinyRLError
from tinyrl.tasks.base import RewardFn, Task

__all__ = ["RewardFn", "Task", "all_tasks", "calls_tools", "check_rows", "get_task", "offered_tools", "option_unread", "task_problems", "template_of", "task_line", "answer_patterns"]

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


def calls_tools(task_cfg) -> bool:
    """Whether episodes of a [task] section (TaskConfig) offer tools: its task's, or
    task.extra_tools, read without importing a user's file (the memory plan, the cost)."""
    return bool(get_task(task_cfg.name).tools or task_cfg.extra_tools)


def offered_tools(task_cfg) -> tuple[str, ...]:
    """The tools episodes of a [task] section (TaskConfig) offer, in the order the prompt lists
    them: its task's (Task.tools), then task.extra_tools' (registered in tinyrl.tools.TOOLS here)."""
    own = get_task(task_cfg.name).tools
    if not task_cfg.extra_tools:
        return own
    from tinyrl.tools.user import register_extra_tools

    return own + register_extra_tools(task_cfg.extra_tools)


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
    if task.tools or t.extra_tools:  # episodes with tools: the template lists the tools and writes the tool turns
        from tinyrl.tools import TOOLS, offered_problems
        from tinyrl.tools.user import load_extra_tools

        extra, said = load_extra_tools(t.extra_tools)  # read, not registered: a check changes nothing
        out += said
        registry = {**TOOLS, **{tool.name: tool for tool in extra}}
        out += [f"the {t.name} task's tools: {problem}" for problem in offered_problems(task.tools, registry)]
        if not cfg.data.chat_template:
            whose = f"the {t.name} task calls tools" if task.tools else "task.extra_tools offers tools"
            out.append(f"{whose}, so its prompts must go through the chat template: "
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


# The files the shipped presets download (README), by name: a hint for one of them names its
# source, whichever setting reads it (the ReTool preset's AIME test file is not DAPO-Math-17k)
SOURCES = {"dapo-math-17k": "hf:BytedTsinghua-SIA/DAPO-Math-17k", "aime_2024": "hf:Maxwell-Jia/AIME_2024",
           "aime_2024-train": "hf:Maxwell-Jia/AIME_2024", "math-500-test": "hf:HuggingFaceH4/MATH-500:test",
           "retool-sft": "hf:JoeYing/ReTool-SFT"}


def table_hint(task: Task, path, sft: bool = False) -> str:
    """The command that turns `path`, a plain table of problems and answers, into `task`'s prompts;
    "" when the task's data command converts none (Task.converts_tables), or for an SFT run's
    file, which is not prompts (retool's --sft --from reads traces, not such a table)."""
    if not task.converts_tables or sft:
        return ""
    return f"`tinyrl data {task.name} --from {shlex.quote(str(path))} --out DIR`"


def _sft_hint(task: Task) -> str:
    """How to make `tinyrl sft`'s file for `task`: its own SFT command, its data command with
    --sft when it generates SFT rows, else a file of the user's (`tinyrl data math --sft` was
    the hint for math until 2026-11-28, and that command has no --sft)."""
    if task.sft_data_hint:
        return task.sft_data_hint
    if task.generate_sft is not None:
        return task.data_hint.replace(" --out DIR`", " --sft --out DIR`")
    return (f"a script of your own (the {task.name} task's data command makes RL prompts, not SFT rows): "
            "an SFT file is parquet with prompt + response columns, or a messages column (README, \"SFT, then RL\")")


def data_hint(cfg, path: str | None = None) -> str:
    """How to make the file the run's command reads, `path` (data.train_path unless given): the
    task's RL data command, or its SFT one, writing that very file. A command with --from names
    its file by the input (`hf:...DAPO-Math-17k` -> dapo-math-17k-train.parquet) unless --name
    says otherwise, so the hint gives --name and --out from the path: the preset's own file
    (data/retool/dapo-math-17k.parquet) was missing again after following `--out DIR`. A generated
    file is DIR/train.parquet or test.parquet (sft_...); of another name, DIR stays for the user,
    as it does for a file that exists (one tinyrl cannot read is not to be written over)."""
    from tinyrl.config import resolve_path

    task = get_task(cfg.task.name)
    sft = cfg.command == "sft"
    hint = _sft_hint(task) if sft else task.data_hint
    given = path is not None and path != cfg.data.train_path
    target = Path(cfg.data.train_path if path is None else path)
    command = re.fullmatch(r"`([^`]*)`.*", hint, re.S)
    if target.suffix != ".parquet" or command is None or resolve_path(target.as_posix()).exists():
        return hint
    words = command.group(1).split()
    out = shlex.quote(target.parent.as_posix())
    generated = ("sft_train.parquet", "sft_test.parquet") if sft else ("train.parquet", "test.parquet")
    if "--from" in words and target.name in generated and target.stem not in SOURCES \
            and (task.generate_sft if sft else task.generate) is not None:
        for flag in ("--from", "--name"):  # the task's generated problems: DIR/train.parquet and test.parquet
            if flag in words:
                del words[words.index(flag):words.index(flag) + 2]
    if "--from" in words:
        at = words.index("--from") + 1
        # another file than the task's own source: a known download's, else any table
        if target.stem in SOURCES or given:
            words[at] = SOURCES.get(target.stem, "FILE|hf:NAME[:split]")
        if "--name" in words:
            del words[words.index("--name"):words.index("--name") + 2]
        words[words.index("--out"):words.index("--out") + 2] = ["--name", shlex.quote(target.stem), "--out", out]
        return f"`{' '.join(words)}`"
    if target.name in generated:
        words[words.index("--out") + 1] = out
        return f"`{' '.join(words)}`"
    return hint


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
