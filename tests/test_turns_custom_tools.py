"""A user's own tools in the turn loop (README, "Episodes with tools": the custom tool contract):
whatever a tool does -- raise, return something other than a ToolResult, never return -- the
episode goes on with a tool turn that says so, and the rollout neither crashes nor waits for it.

The tools here carry code_interpreter's schema (the chat template's tool list) with their own
`run`; the policy is scripted, the turn loop and chat template are the real ones."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest
from transformers import AutoTokenizer

from helpers.hermes_template import HERMES_TEMPLATE
from helpers.scripted_engine import ScriptedEngine
from tinyrl.rollout.base import TOOL_MESSAGE_CHARS, SamplingSettings
from tinyrl.rollout.chat import ToolChat
from tinyrl.rollout.transcript import transcript
from tinyrl.rollout.turns import EpisodeLimits, episode_metrics, run_episodes
from tinyrl.tools import TOOLS, Tool, ToolResult, call_tool, render

SCHEMA = TOOLS["code_interpreter"].schema


@pytest.fixture(scope="module")
def chat(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = HERMES_TEMPLATE
    return ToolChat(tok, [SCHEMA], [tok.eos_token_id])


def _ok(text: str) -> ToolResult:
    return ToolResult(stdout=text, stderr="", exit_code=0)


def _episodes(chat, run, *, k=1, limits=EpisodeLimits(tool_timeout_s=5.0), grace_s=2.0, budget=400):
    """k prompts, one episode each: turn 1 calls the tool with code "<prompt index>", then an
    answer, within `budget` tokens (rollout.max_response_length). -> the episodes"""
    def script(context, j):
        if "<tool_response>" in context:
            return "<answer> done </answer>"
        task = context.split("task ")[-1].split(":")[0]
        return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": task}}) + "\n</tool_call>"

    msgs = [[{"role": "user", "content": f"task {i}: go"}] for i in range(k)]
    tool = Tool("code_interpreter", SCHEMA, run, grace_s=grace_s)
    res = run_episodes(ScriptedEngine(chat.tokenizer, script), [chat.render(m, generation_prompt=True) for m in msgs],
                       SamplingSettings(n=1, max_new_tokens=budget, seed=1), chat=chat,
                       tools={"code_interpreter": tool}, limits=limits, messages=msgs)
    return res.episodes


def _tool_text(chat, e) -> str:
    tool = next(t for t in e.turns if t.role == "tool")
    return chat.tokenizer.decode(e.response_ids[tool.start:tool.end])


def _goes_on(e) -> None:
    """The episode after a failed call: its tool turn, then the model's answer, as any call's."""
    assert [t.role for t in e.turns] == ["assistant", "tool", "assistant"] and e.stop_reason == "stop"
    assert e.rerender == "same"


def test_a_tool_that_raises_becomes_an_error_turn(chat):
    def run(arguments, create_kwargs, **limits):
        raise RuntimeError("my tool's backend is down")

    (e,) = _episodes(chat, run)
    _goes_on(e)
    assert [c.status for c in e.tool_calls] == ["error"]
    assert "[error: tool 'code_interpreter' raised RuntimeError: my tool's backend is down]" in _tool_text(chat, e)
    assert episode_metrics([e])["tools/errors"] == 1.0


def test_a_failed_calls_message_is_kept_when_its_tool_turn_does_not_fit(chat):
    """A budget that leaves no room for the error turn (countdown-tools-demo's 160 tokens, a tool
    whose run raises): the turn is not appended, so the call's own record must say why it failed,
    in the episode and in what samples.jsonl keeps of it (transcript); the message is cut."""
    def run(arguments, create_kwargs, **limits):
        raise RuntimeError("my tool's backend is down " + "x" * 500)

    (whole,) = _episodes(chat, run)
    first = whole.turns[0].end                # turn 1's tokens: the call
    (e,) = _episodes(chat, run, budget=first + 5)
    assert [t.role for t in e.turns] == ["assistant"] and e.stop_reason == "length"
    (call,) = e.tool_calls
    assert call.status == "error"
    assert call.message.startswith("error: tool 'code_interpreter' raised RuntimeError: my tool's backend is down x")
    assert len(call.message) == TOOL_MESSAGE_CHARS
    assert transcript(chat.tokenizer, e)["tool_calls"][0]["message"] == call.message
    assert [c.message for c in whole.tool_calls] == [call.message]  # the same when the turn fits


def test_an_ok_calls_record_has_no_message(chat):
    (e,) = _episodes(chat, lambda arguments, create_kwargs, **limits: _ok("7\n"))
    assert [(c.status, c.message) for c in e.tool_calls] == [("ok", "")]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_a_stop_of_the_run_raised_in_a_tool_stops_the_rollout(chat, stop):
    def run(arguments, create_kwargs, **limits):
        raise stop()

    with pytest.raises(stop):
        _episodes(chat, run)


@pytest.mark.parametrize("returned", ["plain string", None, {"stdout": "7"}, ("7", "", 0)])
def test_a_tool_returning_another_type_becomes_an_error_turn(chat, returned):
    (e,) = _episodes(chat, lambda arguments, create_kwargs, **limits: returned)
    _goes_on(e)
    assert [c.status for c in e.tool_calls] == ["error"]
    text = _tool_text(chat, e)
    assert f"returned a {type(returned).__name__}, not a tinyrl.tools.ToolResult" in text


@pytest.mark.parametrize("fields, wrong", [
    ({"stdout": b"7\n", "stderr": b"", "exit_code": 0}, "stdout is a bytes"),  # subprocess.run without text=True
    ({"stdout": "7\n", "stderr": None, "exit_code": 0}, "stderr is a NoneType"),
    ({"stdout": "7\n", "stderr": "", "exit_code": "0"}, "exit_code is a str"),
    ({"stdout": "", "stderr": "", "exit_code": 1, "message": 3}, "message is a int")])
def test_a_tool_result_with_fields_of_another_type_becomes_an_error_turn(chat, fields, wrong):
    """A ToolResult whose fields are not what render reads (a str's methods on bytes or None)
    raised out of the rollout and stopped the run; it is the call's failure, as any other."""
    (e,) = _episodes(chat, lambda arguments, create_kwargs, **limits: ToolResult(**fields))
    _goes_on(e)
    assert [c.status for c in e.tool_calls] == ["error"]
    assert f"returned a ToolResult whose {wrong}" in _tool_text(chat, e)
    assert episode_metrics([e])["tools/errors"] == 1.0


def test_a_tool_that_changes_its_create_kwargs_changes_no_other_episodes(chat):
    """create_kwargs is the episode's own state (README): a tool that writes into it (a stateful
    tool keeping what it was asked) must not change what its prompt's other episodes get, nor the
    row. They shared the row's one dict: the episodes' outputs were 1, 2, 3 in the order their
    calls happened to run, so a seeded rollout did not repeat."""
    def run(arguments, create_kwargs, **limits):
        create_kwargs.setdefault("asked", []).append(arguments["code"])
        return _ok(f"asked {len(create_kwargs['asked'])} times\n")

    def script(context, j):
        return ("<answer> done </answer>" if "<tool_response>" in context else
                "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": "1"}}) + "\n</tool_call>")

    msgs = [[{"role": "user", "content": "task 0: go"}]]
    row_kwargs = {"code_interpreter": {"create_kwargs": {"setup": "a = 1"}}}
    res = run_episodes(ScriptedEngine(chat.tokenizer, script), [chat.render(m, generation_prompt=True) for m in msgs],
                       SamplingSettings(n=3, max_new_tokens=400, seed=1), chat=chat,
                       tools={"code_interpreter": Tool("code_interpreter", SCHEMA, run)},
                       limits=EpisodeLimits(tool_timeout_s=5.0), messages=msgs, tools_kwargs=[row_kwargs])
    for e in res.episodes:
        _goes_on(e)
        assert "asked 1 times" in _tool_text(chat, e)
    assert row_kwargs == {"code_interpreter": {"create_kwargs": {"setup": "a = 1"}}}


def test_a_hung_tool_times_out_and_leaves_the_pool_to_the_next_call(chat):
    """One worker, two episodes: the first call never returns by itself (until the test lets it),
    the second is quick. The first is given up after tool_timeout_s + the tool's grace (status
    timeout, its real seconds), and the second still runs on the one worker; the rollout returns
    while the hung call's thread still runs. Seconds are the wall clock measured by the loop,
    not what the tool claims (0.0 here)."""
    release = threading.Event()
    hung: list[threading.Thread] = []

    def run(arguments, create_kwargs, **limits):
        if arguments["code"] == "0":
            hung.append(threading.current_thread())
            release.wait(60)      # old loops waited for this, then read it as "ok"
        else:
            time.sleep(0.05)
        return _ok("fine\n")

    limits = EpisodeLimits(tool_timeout_s=0.3, tool_workers=1)
    try:
        first, second = _episodes(chat, run, k=2, limits=limits, grace_s=0.2)
        assert hung[0].is_alive()  # returned without waiting for it
    finally:
        release.set()
        for t in hung:
            t.join()
    _goes_on(first)
    _goes_on(second)
    assert [c.status for c in first.tool_calls] == ["timeout"] and [c.status for c in second.tool_calls] == ["ok"]
    assert "[timed out: the tool did not return within 0.3 s (wall clock)" in _tool_text(chat, first)
    assert "fine" in _tool_text(chat, second)
    assert first.tool_calls[0].seconds >= 0.3 + 0.2 and second.tool_calls[0].seconds >= 0.05
    assert episode_metrics([first, second])["tools/timeouts"] == 1.0


def test_a_tool_whose_calls_never_return_stops_the_run_past_the_limit_of_hung_calls(chat, monkeypatch):
    """Each given-up call's thread runs on (Python cannot stop it): a tool that hangs for good
    leaked one per call until the run could start no thread, hours in. Past MAX_HUNG_CALLS of one
    tool's still running, the rollout stops with the tool's name (a resumable stop); calls that
    returned since are not counted, so a backend that was down for a while does not stop a run."""
    import tinyrl.tools as tools_module
    from tinyrl.errors import TinyRLError

    monkeypatch.setattr(tools_module, "MAX_HUNG_CALLS", 3)
    monkeypatch.setattr(tools_module, "_hung", [])
    release = threading.Event()
    hung: list[threading.Thread] = []

    def run(arguments, create_kwargs, **limits):
        hung.append(threading.current_thread())
        release.wait(60)
        return _ok("late\n")

    limits = EpisodeLimits(tool_timeout_s=0.05, tool_workers=4)
    try:
        episodes = _episodes(chat, run, k=3, limits=limits, grace_s=0.05)  # 3 hung: at the limit, not past it
        assert [e.tool_calls[0].status for e in episodes] == ["timeout"] * 3
        release.set()
        for t in hung:
            t.join()
        release.clear()
        episodes = _episodes(chat, run, k=3, limits=limits, grace_s=0.05)  # the first 3 returned: not counted
        assert [e.tool_calls[0].status for e in episodes] == ["timeout"] * 3
        with pytest.raises(TinyRLError) as info:
            _episodes(chat, run, k=1, limits=limits, grace_s=0.05)
    finally:
        release.set()
        for t in hung:
            t.join()
    assert info.value.message.startswith("tool 'code_interpreter': 4 of its calls are still running after being "
                                         "given up (0.1 s each")
    assert info.value.resumable and "return within timeout_s by itself" in info.value.hint


def test_a_tools_own_result_needs_only_its_output_and_exit_code():
    """ToolResult's sandbox-only fields (timed_out, killed_by, ..., pid_namespace) default to a
    call that simply finished; a failing tool that gave no message still says its exit code."""
    def run(arguments, create_kwargs, **limits):
        code = int(arguments["code"])
        return ToolResult(stdout=f"out {code}\n", stderr="oops\n" if code else "", exit_code=code)

    ok = call_tool(Tool("t", SCHEMA, run), {"code": "0"}, {}, timeout_s=1.0, memory_mb=256)
    failed = call_tool(Tool("t", SCHEMA, run), {"code": "3"}, {}, timeout_s=1.0, memory_mb=256)
    assert (ok.status, render(ok), ok.message) == ("ok", "out 0", "exit code 0")
    assert (failed.status, render(failed), failed.message) == ("error", "out 3\noops\n[exit code 3]", "exit code 3")


def test_a_tool_that_prints_a_lot_reaches_its_tool_turn_as_head_and_tail():
    """A tool of one's own has no sandbox to bound what it returns, and the turn loop tokenizes
    a tool turn's whole text before cutting it to rollout.max_tool_response_tokens: 10 MB of
    stdout took 20 s and 3.9 GB there, per call. call_tool keeps each field's head and tail."""
    flood = "".join(f"line {i}\n" for i in range(1_000_000))  # 6.9 MB
    tool = Tool("t", SCHEMA, lambda arguments, create_kwargs, **limits: ToolResult(flood, flood, 0, message=flood))
    result = call_tool(tool, {"code": "1"}, {}, timeout_s=1.0, memory_mb=256)
    assert result.status == "ok" and result.truncated
    for text in (result.stdout, result.stderr):
        assert len(text) < 70_000 and text.startswith("line 0\n") and text.endswith("line 999999\n")
        assert "characters cut ...]" in text
    assert len(result.message) < 70_000 and result.message.endswith("; output truncated")
    quiet = call_tool(Tool("t", SCHEMA, lambda arguments, create_kwargs, **limits: _ok("7\n")), {"code": "1"}, {},
                      timeout_s=1.0, memory_mb=256)
    assert (quiet.stdout, quiet.truncated, render(quiet)) == ("7\n", False, "7")


def test_call_tool_keeps_a_tools_own_result_and_gives_its_limits():
    """A tool that keeps the contract: its result as it gave it (seconds measured here), the
    limits and create_kwargs passed as the contract says."""
    seen = {}

    def run(arguments, create_kwargs, *, timeout_s, memory_mb):
        seen.update(arguments=arguments, create_kwargs=create_kwargs, timeout_s=timeout_s, memory_mb=memory_mb)
        return ToolResult("out\n", "err\n", 3, False, None, False, 0.0, "exit code 3", "", False)

    result = call_tool(Tool("t", SCHEMA, run), {"code": "1"}, {"setup": "a=1"}, timeout_s=4.0, memory_mb=256)
    assert seen == {"arguments": {"code": "1"}, "create_kwargs": {"setup": "a=1"}, "timeout_s": 4.0, "memory_mb": 256}
    assert (result.stdout, result.stderr, result.exit_code, result.message, result.status) == (
        "out\n", "err\n", 3, "exit code 3", "error")
    assert result.seconds > 0.0


def _readme_section() -> str:
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    return readme.split("**Your own tools.**", 1)[1]


def _readme_own_tool_file() -> str:
    """README's example of a tool of one's own ("Your own tools"): add_tool.py, exactly as shown."""
    return _readme_section().split("```python\n", 1)[1].split("\n```", 1)[0] + "\n"


def _readme_own_tool_command() -> list[str]:
    """The command README runs it with, as the shell splits it."""
    import shlex

    line = next(line for line in _readme_section().splitlines() if line.startswith("    tinyrl "))
    return shlex.split(line)


@pytest.fixture()
def readme_tool():
    """README's tool (its file run as a module) in TOOLS and in the arith task's own tools, as a
    checkout that edits a task would have them; undone after."""
    from tinyrl.tasks import all_tasks

    tools, tasks = dict(TOOLS), dict(all_tasks())
    try:
        module: dict = {"__name__": "add_tool"}
        exec(compile(_readme_own_tool_file(), "add_tool.py", "exec"), module)
        TOOLS["add"] = module["add"]
        all_tasks()["arith"] = dataclasses.replace(tasks["arith"], tools=(*tasks["arith"].tools, "add"))
        yield
    finally:
        TOOLS.clear(), TOOLS.update(tools)
        all_tasks().clear(), all_tasks().update(tasks)


def test_readmes_own_tool_is_offered_after_the_tasks_and_called_in_an_episode(chat, tmp_path, monkeypatch,
                                                                               tool_registry):
    """README's add_tool.py named in task.extra_tools: what the trainer rolls out with (ToolRollout
    of offered_tools, as Trainer does) offers it after code_interpreter and calls the file's run."""
    from tinyrl.config import RolloutConfig, load_config
    from tinyrl.rollout.turns import ToolRollout
    from tinyrl.tasks import offered_tools

    (tmp_path / "add_tool.py").write_text(_readme_own_tool_file())
    monkeypatch.chdir(tmp_path)
    cfg = load_config("countdown-tools-demo", ['task.extra_tools=["add_tool.py:add"]', "model.init_from="])
    assert offered_tools(cfg.task) == ("code_interpreter", "add")
    result = call_tool(TOOLS["add"], {"a": 2, "b": 3.5}, {}, timeout_s=1.0, memory_mb=256)
    assert (result.status, render(result)) == ("ok", "5.5")

    def script(context, j):
        if "<tool_response>" in context:
            return "<answer> done </answer>"
        return "<tool_call>\n" + json.dumps({"name": "add", "arguments": {"a": 20, "b": 22}}) + "\n</tool_call>"

    engine = ScriptedEngine(chat.tokenizer, script)
    rollout = ToolRollout(offered_tools(cfg.task), chat.tokenizer, engine, RolloutConfig())
    msgs = [{"role": "user", "content": "task 0: add"}]
    prompt = chat.tokenizer.decode(rollout.chat.render(msgs, generation_prompt=True))
    assert prompt.index('"name": "code_interpreter"') < prompt.index('"name": "add"')
    (e,) = run_episodes(engine, [rollout.chat.render(msgs, generation_prompt=True)],
                        SamplingSettings(n=1, max_new_tokens=400, seed=1), chat=rollout.chat,
                        tools=rollout.tools, limits=rollout.limits, messages=[msgs]).episodes
    assert [(c.name, c.status) for c in e.tool_calls] == [("add", "ok")]
    assert "42" in _tool_text(chat, e) and e.stop_reason == "stop"


@pytest.mark.parametrize("schema_name, tool_name, offered, said", [
    ("add", "add", "add", None),                       # README's script as it is
    ("sum", "add", "add", "TOOLS['add'] is named 'sum' in its schema (what the prompt offers) and 'add' as its Tool.name"),
    ("add", "ad", "add", "TOOLS['add'] is named 'add' in its schema (what the prompt offers) and 'ad' as its Tool.name"),
    ("add", "add", "ad", "'ad' is not in tinyrl.tools.TOOLS (tools: code_interpreter, add); did you mean 'add'?")])
def test_a_tool_offered_by_another_name_than_it_is_called_by_is_refused_at_the_config_check(
        readme_tool, schema_name, tool_name, offered, said):
    """The prompt offers the schema's name and the turn loop looks a call up by the TOOLS key: a
    tool registered as TOOLS["add"] with a schema named "sum" passed the config check, and every
    call of "sum" came back unknown_tool for the whole run. A typo in the task's tools names the
    nearest tool."""
    from tinyrl.config import load_config
    from tinyrl.tasks import all_tasks, task_problems

    add = TOOLS["add"]
    schema = {"type": "function", "function": {**add.schema["function"], "name": schema_name}}
    TOOLS["add"] = Tool(tool_name, schema, add.run)
    arith = all_tasks()["arith"]
    all_tasks()["arith"] = dataclasses.replace(arith, tools=("code_interpreter", offered))
    problems = [p for p in task_problems(load_config("countdown-tools-demo", check=False)) if "tools: " in p]
    if said is None:
        assert problems == []
        return
    (problem,) = problems
    assert problem.startswith("the arith task's tools: ") and said in problem
    if "TOOLS['add']" in said:
        assert problem.endswith("but a call is looked up by its key, 'add': give all three the same name")


def _positional_only(arguments, create_kwargs, timeout_s, memory_mb, /):
    return ToolResult(stdout="", stderr="", exit_code=0)


@pytest.mark.parametrize("run, said", [
    (lambda arguments, create_kwargs, *, timeout_s, memory_mb: None, None),   # README's signature
    (lambda arguments, create_kwargs=None, **limits: None, None),             # code_interpreter's
    (lambda arguments, *, timeout_s, memory_mb: None, "too many positional arguments"),
    (lambda a, b, *, timeout: None, "missing a required argument: 'timeout'"),
    (lambda a, b, timeout=1: None, "got an unexpected keyword argument 'timeout_s'"),
    (lambda arguments, create_kwargs, timeout_s, memory_mb, extra: None, "missing a required argument: 'extra'"),
    (_positional_only, "'timeout_s' parameter is positional only"),
    ("add", "it is a str, not a function")])
def test_a_tool_whose_run_cannot_take_the_calls_arguments_is_refused_at_the_config_check(readme_tool, run, said):
    """call_tool calls run(arguments, create_kwargs, timeout_s=..., memory_mb=...). A run of
    another shape passed the config check and every call of the whole run came back an error turn
    ("raised TypeError"), a wasted run on a card. Said before any model loads, as a reward's is."""
    from tinyrl.config import load_config
    from tinyrl.tasks import all_tasks, task_problems

    TOOLS["add"] = Tool("add", TOOLS["add"].schema, run)
    arith = all_tasks()["arith"]
    all_tasks()["arith"] = dataclasses.replace(arith, tools=("code_interpreter", "add"))
    problems = [p for p in task_problems(load_config("countdown-tools-demo", check=False)) if "tools: " in p]
    if said is None:
        assert problems == []
        return
    (problem,) = problems
    assert problem.startswith("the arith task's tools: tinyrl.tools.TOOLS['add'].run cannot be called as call_tool "
                              "calls it, run(arguments, create_kwargs, timeout_s=..., memory_mb=...): ")
    assert said in problem and "def run(arguments: dict, create_kwargs: dict, *, timeout_s" in problem


def test_readmes_own_tool_command_is_checked_by_the_tinyrl_command(tmp_path):
    """README's command line, `tinyrl train ... --set 'task.extra_tools=["add_tool.py:add"]'`, beside
    its add_tool.py: the config check (which imports the file and refuses a tool it cannot call)
    passes; run as estimate-cost here, which checks the same config and needs no SFT run. Without
    its data.max_prompt_length, `train` stops at the prompt length README quotes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "add_tool.py").write_text(_readme_own_tool_file())
    words = _readme_own_tool_command()
    assert words[:2] == ["tinyrl", "train"] and 'task.extra_tools=["add_tool.py:add"]' in words
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "estimate-cost", *words[2:], "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) and "roofline: tools: every episode makes" in done.stdout  # priced with its tools
    short = words[:-2] if words[-2:] == ["--set", "data.max_prompt_length=203"] else pytest.fail(words)
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "train", *short[2:], "--set", "model.init_from=",
                           "--max-steps", "1", "--no-dashboard", "--out", "run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "longer than data.max_prompt_length = 192 tokens (the longest has 203" in done.stderr
