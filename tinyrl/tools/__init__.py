"""Tools a model may call in a turn: their OpenAI function schemas, how to run a call, and how a
result reads as the text of a tool turn.

`TOOLS` is the one registry: name -> `Tool`. A task lists the names it offers; the turn loop
(another layer) parses a call, looks the tool up here, runs it with `call_tool(tool, arguments,
create_kwargs, ...)` and puts `render(result)` into the conversation. `call_tool` holds a tool to
its contract (`Tool`): an exception, a result of another type or a call that does not return in
time becomes a ToolResult that says so, so a user's own tool cannot crash or stall a rollout.
Knows nothing of tasks, chat templates or tokens.

`create_kwargs` is an episode's own state for a tool, verl's name and place for it: a dataset
row's `extra_info.tools_kwargs[tool]["create_kwargs"]` (verl 0.9.1: utils/dataset/rl_dataset.py
reads `extra_info.tools_kwargs`; experimental/agent_loop/tool_agent_loop.py passes
`create_kwargs` to `BaseTool.create` before each call). The Python tool takes `setup`: code run
before every call's code, in the same fresh interpreter (a task's data, loaded for the model).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from tinyrl.tools.prints import in_tool_call
from tinyrl.tools.python import _BACKSTOP_S, ToolResult, run_code, run_many

__all__ = ["TOOLS", "Tool", "ToolResult", "call_tool", "offered_problems", "prints", "render", "run_code", "run_many"]

# A tool's default grace (Tool.grace_s): a tool that keeps to timeout_s returns within a moment of it
GRACE_S = 2.0
# Calls given up on (call_tool) whose threads still run: Python cannot stop a thread, so a tool
# that hangs for good leaks one per call, and a run went on until it could start no thread or
# had no memory left, hours in. Past this many of one tool's at once the run stops and says why.
# Many: a backend down for a minute hangs a few rounds of calls that all return later.
MAX_HUNG_CALLS = 256
_hung: list[tuple[str, threading.Thread]] = []
_hung_lock = threading.Lock()


@dataclass(frozen=True)
class Tool:
    """A tool the model may call (README, "Episodes with tools": the custom tool contract).

    `run(arguments, create_kwargs, *, timeout_s, memory_mb) -> ToolResult`: the call's parsed JSON
    arguments (checked against `schema`), the episode's create_kwargs for this tool ({} when none)
    and the rollout's limits, which the tool should keep to. What it returns is rendered into the
    tool turn (`render`); its status is ToolResult.status. `call_tool` turns an exception (not
    KeyboardInterrupt / SystemExit), a return of another type, or no return within timeout_s +
    `grace_s` into an error / timeout result instead; a call given up on runs on in its thread
    (Python cannot stop a thread) until it returns by itself."""

    name: str
    schema: dict[str, Any]                        # {"type": "function", "function": {...}}
    run: Callable[..., ToolResult]
    # seconds past timeout_s the caller waits for `run` to return before it gives the call up as
    # timed out: a tool that enforces timeout_s itself and cleans up after it needs a moment more
    grace_s: float = GRACE_S


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
    # the sandbox times out by itself and says how (killed processes, output so far); on a busy
    # machine its kill and cleanup take seconds (fork bombs), so its grace is its own backstop's
    # (run_code kills its launcher _BACKSTOP_S past the deadline) and more: the caller's clock
    # is only for a sandbox stuck past that
    "code_interpreter": Tool("code_interpreter", CODE_INTERPRETER_SCHEMA, _run_code_tool, grace_s=2 * _BACKSTOP_S),
}


def offered_problems(names: tuple[str, ...], registry: dict[str, Tool] | None = None) -> list[str]:
    """What is wrong with the tools a task offers (`names`, keys of `registry`: TOOLS, or TOOLS and
    the task.extra_tools about to be registered), each saying what to do: a
    name TOOLS lacks, or a tool registered under one name and called another in its schema (the
    name the prompt offers the model) or its Tool.name: the turn loop looks a call up by the key,
    so every call of the offered name would come back an unknown tool."""
    import difflib

    tools = TOOLS if registry is None else registry
    out = []
    for name in names:
        if name not in tools:
            near = difflib.get_close_matches(name, tools, n=1)
            out.append(f"{name!r} is not in tinyrl.tools.TOOLS (tools: {', '.join(tools)})"
                       + (f"; did you mean {near[0]!r}?" if near else "; register it there before the command runs"))
            continue
        tool = tools[name]
        schema = tool.schema if isinstance(tool.schema, dict) else {}
        function = schema.get("function")
        said = (function if isinstance(function, dict) else schema).get("name")
        if said != name or tool.name != name:
            out.append(f"tinyrl.tools.TOOLS[{name!r}] is named {said!r} in its schema (what the prompt offers) and "
                       f"{tool.name!r} as its Tool.name, but a call is looked up by its key, {name!r}: give all three "
                       "the same name")
        if (wrong := _call_shape_problem(tool.run)) is not None:
            out.append(f"tinyrl.tools.TOOLS[{name!r}].run cannot be called as call_tool calls it, "
                       f"run(arguments, create_kwargs, timeout_s=..., memory_mb=...): {wrong}; every call would "
                       "come back an error turn: define it as `def run(arguments: dict, create_kwargs: dict, *, "
                       "timeout_s: float, memory_mb: int) -> ToolResult`")
    return out


def _call_shape_problem(run: Callable[..., ToolResult]) -> str | None:
    """Why `run` cannot take call_tool's arguments (None: it can, or it has no signature to read)."""
    import inspect

    if not callable(run):
        return f"it is a {type(run).__name__}, not a function"
    try:
        signature = inspect.signature(run)
    except (TypeError, ValueError):  # a builtin or C extension: its first call says what is wrong
        return None
    try:
        signature.bind({}, {}, timeout_s=1.0, memory_mb=1)
    except TypeError as e:
        return str(e)
    return None


def call_tool(tool: Tool, arguments: dict[str, Any], create_kwargs: dict[str, Any], *, timeout_s: float,
              memory_mb: int) -> ToolResult:
    """Run one call of `tool` -> a ToolResult whatever the tool does (Tool's contract), its
    `seconds` the wall clock measured here. The call runs on a thread of its own, so a call
    that never returns is given up after timeout_s + tool.grace_s and holds none of the
    caller's threads (a pool's worker stays free for the next call). KeyboardInterrupt and
    SystemExit from the tool are raised here: they stop the run, not the call."""
    start = time.monotonic()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            with in_tool_call():  # its prints: RUN_DIR/tool_prints.log (tinyrl.tools.prints)
                box["result"] = tool.run(arguments, create_kwargs, timeout_s=timeout_s, memory_mb=memory_mb)
        except Exception as e:  # the tool's failure: the model reads it in the tool turn
            box["error"] = e
        except BaseException as e:  # a stop of the run: raised again in the caller's thread
            box["stop"] = e

    worker = threading.Thread(target=target, name=f"tinyrl-tool-call-{tool.name}", daemon=True)
    worker.start()
    worker.join(timeout_s + tool.grace_s)
    seconds = time.monotonic() - start
    if worker.is_alive():
        _check_hung(tool.name, worker, timeout_s + tool.grace_s)
        return _failed(f"timed out: the tool did not return within {timeout_s:g} s (wall clock); its call "
                       "was given up", seconds, timed_out=True)
    if "stop" in box:
        raise box["stop"]
    if "error" in box:
        e = box["error"]
        return _failed(f"error: tool {tool.name!r} raised {type(e).__name__}: {e}", seconds)
    result = box["result"]
    if not isinstance(result, ToolResult):
        return _failed(f"error: tool {tool.name!r} returned a {type(result).__name__}, not a "
                       "tinyrl.tools.ToolResult (its run must return one)", seconds)
    # what render and the call's record read: bytes (subprocess.run without text=True) or None
    # there raised out of the rollout, a tool's failure stopping the run
    for name, want in _FIELD_TYPES:
        value = getattr(result, name)
        if not isinstance(value, want):
            return _failed(f"error: tool {tool.name!r} returned a ToolResult whose {name} is a {type(value).__name__}, "
                           f"not a {want.__name__}", seconds)
    return replace(_bounded(result), seconds=seconds)


def _check_hung(name: str, worker: threading.Thread, waited_s: float) -> None:
    """Count `worker`, a call of tool `name` given up on; raise once more than MAX_HUNG_CALLS of
    that tool's given-up calls are still running (those that returned since are not counted)."""
    from tinyrl.errors import TinyRLError

    with _hung_lock:
        _hung[:] = [(n, t) for n, t in _hung if t.is_alive()]
        _hung.append((name, worker))
        running = sum(n == name for n, _ in _hung)
    if running > MAX_HUNG_CALLS:
        raise TinyRLError(
            f"tool {name!r}: {running} of its calls are still running after being given up ({waited_s:g} s "
            "each: its timeout_s and grace_s); Python cannot stop them, and each holds a thread, so the run "
            "stops here before it runs out of threads or memory",
            hint=f"make {name}'s run return within timeout_s by itself (a timeout on its network call or "
                 "lock), or run its work in a subprocess that can be killed, as tinyrl.tools.run_code does",
            resumable=True)


_FIELD_TYPES = (("stdout", str), ("stderr", str), ("exit_code", int), ("message", str))
# The most of a tool's stdout, stderr or message that reaches its tool turn: the turn loop
# tokenizes the whole text before cutting it to rollout.max_tool_response_tokens (10 MB of a
# tool's own stdout took 20 s and 3.9 GB there). Above the sandbox's own 16 KiB a stream
# (run_code's max_output_bytes), so the sandbox's output is never cut twice.
MAX_OUTPUT_CHARS = 65536


def _bounded(result: ToolResult) -> ToolResult:
    """`result` with each field longer than MAX_OUTPUT_CHARS cut to its head and tail, as the
    sandbox cuts a stream (a traceback's last line is the one that matters); marked truncated."""
    cut = {name: _head_and_tail(getattr(result, name)) for name in ("stdout", "stderr", "message")
           if len(getattr(result, name)) > MAX_OUTPUT_CHARS}
    if not cut:
        return result
    message = cut.pop("message", result.message)
    if not result.truncated:
        message += "; output truncated"
    return replace(result, **cut, message=message, truncated=True)


def _head_and_tail(text: str) -> str:
    half = MAX_OUTPUT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _failed(message: str, seconds: float, timed_out: bool = False) -> ToolResult:
    """The result of a call that gave none of its own: `message` is its tool turn (render)."""
    return ToolResult(stdout="", stderr="", exit_code=-1, timed_out=timed_out, seconds=seconds, message=message)


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
