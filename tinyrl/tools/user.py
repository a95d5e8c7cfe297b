"""`task.extra_tools`: the user's own tools, offered after the task's, without a script.

Each spec is `path/to/file.py:NAME`, NAME a `tinyrl.tools.Tool` bound at the file's top level.
A path, not a module name: it is recorded with the run, read again by `--resume` from the
directory the run started in (tinyrl.rundir) and copied by export-verl, as a reward file is.
The file is imported in this process (a tool runs on the turn loop's threads), once per
version of it: the config check and the run share the import, and so one-time state in it.
`load_extra_tools` only reads; `register_extra_tools` puts the tools into `TOOLS` under their
`Tool.name`, where the turn loop, the prompt's schemas and export-verl's wrapper look them up.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from types import ModuleType

from tinyrl.errors import TinyRLError
from tinyrl.pyfile import import_failure_hint, import_file
from tinyrl.tools import TOOLS, Tool, offered_problems
from tinyrl.words import counted

SPEC_SHAPE = "path/to/file.py:NAME, NAME a tinyrl.tools.Tool in that file"
_MODULES: dict[tuple[Path, int], ModuleType] = {}   # (resolved file, mtime_ns) -> its module, imported once
_REGISTERED: dict[str, Path] = {}                   # a name this module put into TOOLS -> the file it came from


def parse_tool_spec(spec: str) -> tuple[Path, str] | None:
    """(file, NAME) of `path/to/file.py:NAME` (~ expanded); None when the spec has another shape."""
    where, sep, name = spec.rpartition(":")  # rpartition: "C:\\x.py:add" keeps the drive
    if not sep or not where.endswith(".py") or not name.isidentifier():
        return None
    return Path(where).expanduser(), name


def _module(path: Path) -> ModuleType:
    resolved = path.resolve()
    key = (resolved, resolved.stat().st_mtime_ns)
    if key not in _MODULES:
        # what it prints as it loads goes to stderr: `--json` commands print one object on stdout
        with contextlib.redirect_stdout(sys.stderr):
            module = import_file(resolved, "tinyrl_user_tools")
        if module is None:
            raise ImportError(f"{path} cannot be imported as a Python file")
        _MODULES[key] = module
    return _MODULES[key]


def _load(spec: str) -> Tool | str:
    """The Tool a spec names, or what is wrong with it (a config problem's text)."""
    setting = f"task.extra_tools entry {spec!r}"
    parsed = parse_tool_spec(spec)
    if parsed is None:
        return f"{setting} is not {SPEC_SHAPE}"
    path, name = parsed
    if not path.is_file():
        return f"{setting}: no file {path} (a relative path starts at {Path.cwd()})"
    try:
        module = _module(path)
    except (Exception, SystemExit) as e:  # any error in the user's file is theirs to fix
        return f"{setting}: importing {path} failed: {type(e).__name__}: {e} ({import_failure_hint(path, e)})"
    if not hasattr(module, name):
        tools = [n for n, v in vars(module).items() if isinstance(v, Tool)]
        return f"{setting}: {path} binds no {name!r} (its tinyrl.tools.Tool objects: {', '.join(tools) or 'none'})"
    tool = getattr(module, name)
    if not isinstance(tool, Tool):
        return (f"{setting}: {path}'s {name} is a {type(tool).__name__}, not a tinyrl.tools.Tool; bind "
                f"`{name} = Tool(name, schema, run)` (README, \"Your own tools\")")
    return tool


def load_extra_tools(specs: list[str]) -> tuple[list[Tool], list[str]]:
    """(the tools the specs name, every problem with them): nothing is registered. A problem is a
    spec that names no Tool; a tool whose name another tool already has (a tool of tinyrl's,
    another file's, or another entry's): a call is looked up by that name, so one would be lost;
    and what tinyrl.tools.offered_problems finds (a schema named otherwise, a run of another shape)."""
    tools, problems = [], []
    for spec in specs:
        tool = _load(spec)
        if isinstance(tool, str):
            problems.append(tool)
            continue
        taken = [t for t in tools if t.name == tool.name]
        owner = TOOLS.get(tool.name)
        if taken or (owner is not None and owner is not tool and _REGISTERED.get(tool.name) != _file(spec)):
            problems.append(f"task.extra_tools entry {spec!r}: its tool is named {tool.name!r}, which "
                            + ("another entry's tool is named too" if taken else "is already a tool of tinyrl's "
                               "or of another file (tinyrl.tools.TOOLS)")
                            + "; give it a name of its own (Tool.name and its schema's function.name)")
            continue
        tools.append(tool)
    registry = {**TOOLS, **{tool.name: tool for tool in tools}}
    problems += [f"task.extra_tools: {problem}" for problem in offered_problems(tuple(t.name for t in tools), registry)]
    return tools, problems


def _file(spec: str) -> Path | None:
    parsed = parse_tool_spec(spec)
    return parsed[0].resolve() if parsed else None


def register_extra_tools(specs: list[str]) -> tuple[str, ...]:
    """The specs' tools put into TOOLS -> their names, in order. The config check has said what
    is wrong with them before a run gets here; a file changed since is said again, and raised."""
    tools, problems = load_extra_tools(specs)
    if problems:
        raise TinyRLError(f"task.extra_tools has {counted(len(problems), 'problem')}; no tool of it was offered:\n"
                          + "\n".join(f"  - {p}" for p in problems),
                          hint=f"fix each as it says; an entry is {SPEC_SHAPE} (README, \"Your own tools\")")
    for spec, tool in zip(specs, tools):
        TOOLS[tool.name] = tool
        _REGISTERED[tool.name] = _file(spec)
    return tuple(tool.name for tool in tools)
