"""export-verl for a task with tools: verl's multi-turn rollout settings, its tool config YAML,
and tinyrl's tools (tinyrl.tools.TOOLS: every tool the task offers) wrapped as a verl tool
(OUT/tinyrl_tool.py).

verl 0.9.1, read from the installed package:
- settings: `actor_rollout_ref.rollout.multi_turn.*` (workers/config/rollout.py MultiTurnConfig:
  enable, max_assistant_turns, max_user_turns, max_parallel_calls, max_tool_response_length (in
  CHARACTERS), tool_response_truncate_side, format, tool_config_path) and
  `actor_rollout_ref.rollout.agent.default_agent_loop` (experimental/agent_loop/agent_loop.py:
  rows without an `agent_name` column run this loop; "tool_agent" is ToolAgentLoop);
- the YAML: tools/tool_registry.py initialize_tools_from_config reads `tools[].class_name`,
  `tools[].config` (its `type` must be "native") and `tools[].tool_schema`
  (schemas.py OpenAIFunctionToolSchema), and builds `cls(config=..., tool_schema=...)`;
- the tool: tools/base_tool.py BaseTool(config: dict, tool_schema) (line 36; `self.name` is the
  schema's function name, line 40), `async execute(instance_id, parameters: dict, **kwargs) ->
  tuple[ToolResponse, float, dict]` (line 62; ToolResponse(text=...)). One class serves every
  tool of the task: each instance is one tool of tool_config.yaml, and runs the call through
  tinyrl's registry and rules (tinyrl.tools.TOOLS, tinyrl.rollout.hermes.check_call), never a
  copy of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tinyrl.config import REPO_ROOT, Config
from tinyrl.errors import TinyRLError

TOOL_CONFIG = "tool_config.yaml"
TOOL_MODULE = "tinyrl_tool"           # OUT/tinyrl_tool.py, importable once OUT is on PYTHONPATH
TOOL_CLASS = "TinyRLTool"
CHARS_PER_TOKEN = 4                   # verl cuts a tool response by characters, tinyrl by tokens
SETTINGS = ("rollout.max_turns", "rollout.max_tool_calls", "rollout.max_tool_response_tokens",
            "rollout.tool_timeout_s", "rollout.tool_memory_mb", "rollout.tool_workers")


def task_tools(cfg: Config) -> tuple[str, ...]:
    """The tools the run offers: its task's, then task.extra_tools' (registered here, as in a run)."""
    from tinyrl.tasks import offered_tools

    return offered_tools(cfg.task)


USER_TOOLS = "user_tools"             # OUT/user_tools/: task.extra_tools' files, which tinyrl_tool.py registers


def extra_tool_copies(cfg: Config, out: Path) -> list[tuple[Path, Path]]:
    """(the file, its copy in OUT/user_tools/) of each task.extra_tools file, once each; two
    files of one name from two directories are refused (one copy would replace the other)."""
    from tinyrl.tools.user import parse_tool_spec

    copies: dict[Path, Path] = {}
    for spec in cfg.task.extra_tools:
        parsed = parse_tool_spec(spec)
        if parsed is None:
            continue  # the config check has said so
        source = parsed[0].resolve()
        target = out / USER_TOOLS / source.name
        clash = [s for s, t in copies.items() if t == target and s != source]
        if clash:
            raise TinyRLError(f"task.extra_tools names two files called {source.name}: {clash[0]} and {source}; "
                              f"export-verl copies each into {USER_TOOLS}/ under its name",
                              hint="rename one of them (and its entry in task.extra_tools)")
        copies[source] = target
    return list(copies.items())


def map_tools(cfg: Config, m: Any, o: dict, rollout: str, tool_config_path: str) -> None:
    """verl's multi-turn settings for a task with tools (`rollout` = verl's rollout section);
    without tools the settings have nothing to act on, in tinyrl or in verl."""
    values = {dotted: m.get(cfg, dotted) for dotted in SETTINGS}
    if not task_tools(cfg):
        return
    mt = f"{rollout}.multi_turn"
    o[f"{mt}.enable"] = True
    o[f"{mt}.format"] = "hermes"  # Qwen2.5's <tool_call> JSON, what tinyrl parses
    o[f"{mt}.tool_config_path"] = tool_config_path
    o[f"{mt}.max_assistant_turns"] = values["rollout.max_turns"]
    # verl counts tool turns (each answers one assistant turn's calls); tinyrl counts calls
    o[f"{mt}.max_user_turns"] = values["rollout.max_tool_calls"]
    o[f"{mt}.max_parallel_calls"] = values["rollout.max_tool_calls"]
    o[f"{mt}.max_tool_response_length"] = values["rollout.max_tool_response_tokens"] * CHARS_PER_TOKEN
    o[f"{rollout}.agent.default_agent_loop"] = "tool_agent"
    o["data.return_raw_chat"] = True  # the agent loop renders the messages itself, with the tools
    m.note(cfg, "rollout.max_tool_calls", "verl ends the episode after max_user_turns tool turns and runs at "
           "most max_parallel_calls calls of a turn (both set to it); tinyrl answers calls past the limit "
           "with an error tool turn and lets the model go on")
    m.note(cfg, "rollout.max_tool_response_tokens", f"verl cuts a tool response by characters "
           f"(multi_turn.max_tool_response_length = {CHARS_PER_TOKEN} x this), keeping its head and tail")
    m.notes.append(f"rollout.tool_timeout_s / tool_memory_mb / tool_workers: in {TOOL_CONFIG}, read by "
                   f"{TOOL_MODULE}.py, which runs each call through tinyrl's own tools (tinyrl.tools.TOOLS: "
                   "the Python sandbox for code_interpreter) inside "
                   "verl's agent-loop workers: tinyrl must be importable there, and "
                   f"{TOOL_MODULE}.py on PYTHONPATH (run_verl.sh adds its directory; on other nodes set it)")
    if cfg.task.tool_error_penalty:
        m.note(cfg, "task.tool_error_penalty", "not applied by verl: its compute_score gets the decoded "
               "response and extra_info, not the outcome of each tool call (verl 0.9.1 "
               "experimental/reward_loop/reward_manager/naive.py)")


def tool_config(cfg: Config) -> dict:
    """The YAML verl's initialize_tools_from_config reads: one native tool per tinyrl tool."""
    from tinyrl.tools import TOOLS

    r = cfg.rollout
    return {"tools": [{"class_name": f"{TOOL_MODULE}.{TOOL_CLASS}",
                       "config": {"type": "native", "timeout_s": r.tool_timeout_s, "memory_mb": r.tool_memory_mb,
                                  "max_workers": r.tool_workers},
                       "tool_schema": TOOLS[name].schema} for name in task_tools(cfg)]}


TOOL_SOURCE = '''"""tinyrl's tools as verl {verl} tools: written by `tinyrl export-verl`; {config} names this class,
once per tool the task offers.

verl/tools/base_tool.py (verl 0.9.1): BaseTool.__init__(config: dict, tool_schema:
OpenAIFunctionToolSchema) (line 36; self.name = the schema's function name, line 40), `async
create(instance_id, **kwargs)` (line 46), `async execute(instance_id, parameters, **kwargs) ->
(ToolResponse, reward, metrics)` (line 62), `async release(instance_id)` (line 87). verl's tool
agent loop (experimental/agent_loop/tool_agent_loop.py, _call_tool, lines 465-488) passes a row's
extra_info.tools_kwargs[name]["create_kwargs"] to create before each call, and as parameters the
call's arguments as json.loads reads them: any JSON value, not only an object.

A call is checked by tinyrl's own rules (tinyrl.rollout.hermes.check_call against the tool's
schema in tinyrl.tools.TOOLS: a JSON object with the required arguments of the declared types;
a bad call's tool turn is tinyrl's, e.g. "[error: missing argument(s): expression]"), then runs
tinyrl.tools.TOOLS[name] (code_interpreter: the Python sandbox, tinyrl.tools.python.run_code) with
its instance's create_kwargs (e.g. the Python tool's setup) and the limits of config (timeout_s,
memory_mb) in a pool of config["max_workers"] threads (0 = the usable cores), through
tinyrl.tools.call_tool as tinyrl's turn loop does (a tool that raises, returns something else or
hangs gives an error / timeout result), and its text is tinyrl.tools.render(result): the tool
turn tinyrl trains with."""

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

TINYRL_SRC = {src!r}
try:
    import tinyrl  # noqa: F401
except ImportError:
    sys.path.insert(0, TINYRL_SRC)
from tinyrl.rollout.hermes import check_call
from tinyrl.tools import TOOLS, call_tool, render
from tinyrl.tools.user import register_extra_tools

# task.extra_tools: the user's tool files, copied beside this one (user_tools/) and registered in
# TOOLS as tinyrl's run registered them
register_extra_tools([os.path.join(os.path.dirname(os.path.abspath(__file__)), spec) for spec in {extra!r}])


class {cls}(BaseTool):
    def __init__(self, config: dict, tool_schema):
        super().__init__(config, tool_schema)
        self.timeout_s = float(config.get("timeout_s", 10.0))
        self.memory_mb = int(config.get("memory_mb", 1024))
        workers = int(config.get("max_workers", 0)) or len(os.sched_getaffinity(0))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tinyrl-tool")
        self._create_kwargs = {{}}

    async def create(self, instance_id=None, create_kwargs=None, **kwargs):
        # verl's agent loop passes create_kwargs=...; its older sglang rollout, the entries themselves
        instance_id, response = await super().create(instance_id)
        self._create_kwargs[instance_id] = dict(create_kwargs if create_kwargs is not None else kwargs)
        return instance_id, response

    async def release(self, instance_id: str, **kwargs):
        self._create_kwargs.pop(instance_id, None)

    async def execute(self, instance_id: str, parameters, **kwargs):
        # TOOLS read at each call: a tool registered after this module was imported counts too
        call = check_call(self.name, parameters, {{name: tool.schema for name, tool in TOOLS.items()}})
        if call.status:
            return ToolResponse(text=call.error_turn), 0.0, {{"status": call.status}}
        create = self._create_kwargs.get(instance_id, {{}})
        result = await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: call_tool(TOOLS[call.name], call.arguments, create, timeout_s=self.timeout_s,
                                          memory_mb=self.memory_mb))
        return ToolResponse(text=render(result)), 0.0, {{"status": result.status, "seconds": result.seconds}}
'''


def write_tool_files(cfg: Config, out: Path, verl: str) -> list[Path]:
    """OUT/tool_config.yaml and OUT/tinyrl_tool.py for a task with tools (nothing otherwise)."""
    import shutil

    import yaml

    from tinyrl.tools.user import parse_tool_spec

    if not task_tools(cfg):
        return []
    config, module = out / TOOL_CONFIG, out / f"{TOOL_MODULE}.py"
    # JSON through YAML's safe dumper: plain types only, so verl's OmegaConf reads it as written
    config.write_text(yaml.safe_dump(json.loads(json.dumps(tool_config(cfg))), sort_keys=False))
    copies = extra_tool_copies(cfg, out)
    for source, target in copies:
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(source, target)
    extra = [f"{USER_TOOLS}/{path.resolve().name}:{name}" for path, name in map(parse_tool_spec, cfg.task.extra_tools)]
    module.write_text(TOOL_SOURCE.format(verl=verl, config=TOOL_CONFIG, src=str(REPO_ROOT), cls=TOOL_CLASS,
                                         extra=extra))
    return [config, module, *(target for _, target in copies)]
