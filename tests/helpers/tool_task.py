"""A built-in task declaring the code tool, for tests of the paths a tool task takes (no task
module ships tools here yet): patches tinyrl.tasks.all_tasks for one test."""

from __future__ import annotations

import dataclasses

import tinyrl.tasks as tasks


def give_tools(monkeypatch, name: str, tools: tuple[str, ...] = ("code_interpreter",)) -> None:
    real = tasks.all_tasks

    def with_tools():
        out = dict(real())  # all_tasks() is cached: never change its dict
        out[name] = dataclasses.replace(out[name], tools=tools)
        return out

    monkeypatch.setattr(tasks, "all_tasks", with_tools)
