"""Tools a model may call in a turn: their OpenAI function schemas, how to run a call, and how a
result reads as the text of a tool turn.

`TOOLS` is the one registry: name -> `Tool`. A task lists the names it offers; the turn loop
(another layer) parses a call, looks the tool up here, runs `tool.run(arguments, create_kwargs)`
and puts `render(result)` into the conversation. Knows nothing of tasks, chat templates or tokens.

`create_kwargs` is an episode's own state for a tool, verl's name and place for it: a dataset
row's `extra_info.tools_kwargs[tool]["create_kwargs"]` (verl 0.9.1: utils/dataset/rl_dataset.py
reads `extra_info.tools_kwargs`; experimental/agent_loop/tool_agent_loop.py passes
`create_kwargs` to `BaseTool.create` before each call). The Python tool takes `setup`: code run
before every call's code, in the same fresh interpreter (a task's data, loaded for the model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tinyrl.tools.python import ToolResult, run_code, run_many

__all__ = ["TOOLS", "Tool", "ToolResult", "render", "run_code", "run_many"]


@dataclass(frozen=True)
class Tool:
    name: str
    schema: dict[str, Any]                        # {"type": "function", "function": {...}}
    # (the call's parsed JSON arguments, the episode's create_kwargs, timeout_s=..., memory_mb=...)
    # -> result; never raises
    run: Callable[..., ToolResult]


# The name and parameter verl's ReTool recipe uses (recipe/retool/sandbox_fusion_tool_config.yaml)
CODE_INTERPRETER_SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run a Python program and return what it prints. Use print() for every "
                       "value you want to see; each call starts a fresh interpreter.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}


def _run_code_tool(arguments: dict[str, Any], create_kwargs: dict[str, Any] | None = None, **limits) -> ToolResult:
    return run_code(str(arguments["code"]), setup=str((create_kwargs or {}).get("setup") or ""), **limits)


TOOLS: dict[str, Tool] = {
    "code_interpreter": Tool("code_interpreter", CODE_INTERPRETER_SCHEMA, _run_code_tool),
}


def render(result: ToolResult) -> str:
    """The tool turn's text: stdout, then stderr, then one line when the run did not simply
    finish (timed out / killed / truncated / a non-zero exit). Never empty: a silent program
    says so, because an empty tool turn teaches the model nothing."""
    parts = [s.rstrip("\n") for s in (result.stdout, result.stderr) if s.strip()]
    if result.timed_out or result.killed_by or result.truncated or result.exit_code != 0:
        parts.append(f"[{result.message}]")
    if not parts:
        parts.append("[no output; exit code 0]")
    return "\n".join(parts)
