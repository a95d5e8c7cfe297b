"""`task.extra_tools = ["path/to/file.py:NAME"]`: a user's own tool offered by the `tinyrl`
command itself, without a script. The config check reads the file and says every problem at
once (registering nothing); the run registers the tools and its prompts list them after the
task's; a run's paths are read from where it started; export-verl copies the files and its
verl tool registers them in verl's worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.hermes_template import HERMES_TEMPLATE
from helpers.scripted_engine import ScriptedEngine
from test_trainer import tiny_config
from tinyrl.errors import TinyRLError
from tinyrl.tools import TOOLS

REPO = Path(__file__).resolve().parent.parent

# README's own tool ("Your own tools"), as a file the config names
ADD_TOOL = '''from tinyrl.tools import Tool, ToolResult


def add(arguments, create_kwargs, *, timeout_s, memory_mb):
    return ToolResult(stdout=f"{arguments['a'] + arguments['b']}\\n", stderr="", exit_code=0)


add = Tool("add", {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "required": ["a", "b"],
                   "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}, add)
'''


def _hermes(tmp_path: Path) -> list[str]:
    (tmp_path / "hermes.jinja").write_text(HERMES_TEMPLATE)
    return ["data.chat_template=true", f"model.custom_chat_template={tmp_path / 'hermes.jinja'}"]


def _problems(tmp_path, *extra) -> str:
    with pytest.raises(TinyRLError) as info:
        tiny_config(tmp_path, *_hermes(tmp_path), *extra)
    return info.value.message


def test_a_run_offers_the_tools_of_a_file_after_the_tasks_and_calls_them(tmp_path, monkeypatch, tool_registry,
                                                                         capsys):
    """countdown declares no tool: with task.extra_tools its prompts list `add`, its rollouts are
    episodes whose calls of `add` run the file's function, and the step reports the calls. `tinyrl
    eval RUN` evaluates the run with them (a fresh process: the run's config registers them).
    What the tool prints goes to RUN_DIR/tool_prints.log (eval: stderr), never to stdout."""
    from tinyrl import eval as ev
    from tinyrl.rollout.turns import ToolRollout
    from tinyrl.tools import user
    from tinyrl.trainer import Trainer

    printing = ADD_TOOL.replace("    return ToolResult(", "    print('adding', arguments['a'], arguments['b'])\n"
                                                         "    return ToolResult(", 1)
    assert printing != ADD_TOOL
    (tmp_path / "add_tool.py").write_text(printing)
    cfg = tiny_config(tmp_path, *_hermes(tmp_path), f"task.extra_tools={json.dumps([f'{tmp_path}/add_tool.py:add'])}",
                      "rollout.max_response_length=160", "data.max_prompt_length=600")
    assert "add" not in TOOLS  # the config check reads the file; only the run registers its tools
    trainer = Trainer(cfg, tmp_path / "run")
    assert trainer.inputs.tools == ("add",) and TOOLS["add"].name == "add"
    prompt = trainer.inputs.tokenizer.decode(trainer.inputs.train_prompts[0])
    assert '"name": "add"' in prompt and '"name": "code_interpreter"' not in prompt
    assert trainer.tool_rollout is not None and tuple(trainer.tool_rollout.tools) == ("add",)

    answers: list[str] = []

    def script(context: str, j: int) -> str:
        if "<tool_response>" in context:
            answers.append(context.rpartition("<tool_response>\n")[2].partition("\n</tool_response>")[0])
            return "<answer> 1 + 2 </answer>"
        return "<tool_call>\n" + json.dumps({"name": "add", "arguments": {"a": 20, "b": j}}) + "\n</tool_call>"

    trainer.engine = ScriptedEngine(trainer.inputs.tokenizer, script)
    trainer.tool_rollout = ToolRollout(trainer.inputs.tools, trainer.inputs.tokenizer, trainer.engine, cfg.rollout,
                                       prints_to=trainer.tool_rollout.prints_to)
    m = trainer.train_step()
    assert m["tools/calls"] == cfg.trainer.train_batch_size * cfg.rollout.n
    printed = (tmp_path / "run" / "tool_prints.log").read_text().splitlines()
    assert sorted(set(printed)) == [f"adding 20 {j}" for j in range(cfg.rollout.n)]
    assert len(printed) == m["tools/calls"] and "adding" not in capsys.readouterr().out
    assert (m["tools/errors"], m["episode/turns"]) == (0.0, 2.0)
    assert sorted(set(answers)) == [str(20 + j) for j in range(cfg.rollout.n)]  # the file's add, each call

    trainer.save()
    TOOLS.pop("add"), user._REGISTERED.clear(), user._MODULES.clear()  # as in another process
    answers.clear()
    monkeypatch.setattr(ev, "_engine", lambda kind, path, tok, *a: ScriptedEngine(tok, script))
    summary, _ = ev.evaluate(str(tmp_path / "run"), [f"t={tmp_path}/data/test.parquet"], n=1, ks=[1], engine="hf",
                             out_dir=tmp_path / "eval", progress=False)
    assert summary["tools"] == ["add"] and summary["files"]["t"]["tools/calls"] > 0 and answers
    seen = capsys.readouterr()
    assert "adding" not in seen.out and "adding 20 0" in seen.err  # `eval --json`: stdout is the JSON

    # its export records the [task] section: eval of the merged model offers the tool as well
    from tinyrl.export import export_run

    exported = export_run(tmp_path / "run", tmp_path / "exported")
    TOOLS.pop("add"), user._REGISTERED.clear(), user._MODULES.clear()
    summary, _ = ev.evaluate(str(exported), [f"t={tmp_path}/data/test.parquet"], n=0, ks=[], engine="hf",
                             out_dir=tmp_path / "eval-exported", progress=False)
    assert summary["task"] == "countdown" and summary["tools"] == ["add"]
    assert summary["files"]["t"]["tools/calls"] > 0


def test_eval_of_any_model_offers_the_tools_given_with_extra_tool(tmp_path, tiny_model_dir, monkeypatch,
                                                                  tool_registry):
    """`tinyrl eval MODEL --task countdown --extra-tool add_tool.py:add`: a model before any run
    (a baseline) is evaluated with the user's tool; without the flag the task has none."""
    import shutil

    from transformers import AutoTokenizer

    from tinyrl import eval as ev
    from tinyrl.data.countdown import generate_countdown

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = HERMES_TEMPLATE
    tok.save_pretrained(model)
    generate_countdown(tmp_path / "data", 16, 8, progress=False)
    (tmp_path / "add_tool.py").write_text(ADD_TOOL)
    seen: list[str] = []

    def script(context: str, j: int) -> str:
        seen.append(context)
        if "<tool_response>" in context:
            return "<answer> 1 + 2 </answer>"
        return "<tool_call>\n" + json.dumps({"name": "add", "arguments": {"a": 1, "b": 2}}) + "\n</tool_call>"

    monkeypatch.setattr(ev, "_engine", lambda kind, path, tok, *a: ScriptedEngine(tok, script))
    summary, _ = ev.evaluate(str(model), [f"t={tmp_path}/data/test.parquet"], task_name="countdown", n=0, ks=[],
                             engine="hf", out_dir=tmp_path / "eval", progress=False,
                             extra_tools=[f"{tmp_path}/add_tool.py:add"])
    assert summary["tools"] == ["add"] and summary["files"]["t"]["tools/calls"] == 8
    assert '"name": "add"' in seen[0] and any("<tool_response>\n3\n</tool_response>" in c for c in seen)
    with pytest.raises(TinyRLError, match="--tools: the countdown task declares no tools"):
        ev.evaluate(str(model), [f"t={tmp_path}/data/test.parquet"], task_name="countdown", n=0, ks=[],
                    engine="hf", out_dir=tmp_path / "eval2", progress=False, tools=True)


def test_every_problem_of_the_entries_is_said_at_once_and_nothing_is_registered(tmp_path, tool_registry):
    (tmp_path / "add_tool.py").write_text(ADD_TOOL)
    (tmp_path / "broken.py").write_text("import nothing_of_that_name\n")
    (tmp_path / "shapes.py").write_text(ADD_TOOL + "\nthree = 3\n\n\ndef bare(arguments):\n    pass\n\n\n"
                                        "import dataclasses\nsum_ = dataclasses.replace(add, name='sum_', run=bare,\n"
                                        "    schema={'type': 'function', 'function': {**add.schema['function'], "
                                        "'name': 'sum_'}})\n"
                                        "mine = dataclasses.replace(add, name='code_interpreter')\n")
    entries = ["add_tool.py", f"{tmp_path}/nope.py:add", f"{tmp_path}/broken.py:add", f"{tmp_path}/add_tool.py:sub",
               f"{tmp_path}/shapes.py:three", f"{tmp_path}/shapes.py:mine", f"{tmp_path}/shapes.py:sum_",
               f"{tmp_path}/add_tool.py:add", f"{tmp_path}/shapes.py:add"]
    said = _problems(tmp_path, f"task.extra_tools={json.dumps(entries)}")
    assert "entry 'add_tool.py' is not path/to/file.py:NAME, NAME a tinyrl.tools.Tool in that file" in said
    assert f"no file {tmp_path}/nope.py" in said
    assert "importing" in said and "ModuleNotFoundError: No module named 'nothing_of_that_name'" in said
    assert "binds no 'sub' (its tinyrl.tools.Tool objects: add)" in said
    assert "three is a int, not a tinyrl.tools.Tool" in said
    assert "its tool is named 'code_interpreter', which is already a tool of tinyrl's" in said
    assert "tinyrl.tools.TOOLS['sum_'].run cannot be called as call_tool calls it" in said
    assert f"entry '{tmp_path}/shapes.py:add': its tool is named 'add', which another entry's tool is named too" in said
    assert said.count("\n  - ") == 8  # each entry once, the good one not at all
    assert set(TOOLS) == {"code_interpreter"}  # a check registers nothing

    with pytest.raises(TinyRLError) as info:  # countdown's plain prompts cannot list a tool
        tiny_config(tmp_path, f"task.extra_tools={json.dumps([f'{tmp_path}/add_tool.py:add'])}")
    assert "task.extra_tools offers tools, so its prompts must go through the chat template" in info.value.message


def test_a_tool_file_that_imports_a_module_beside_it_is_told_it_stands_alone(tmp_path, tool_registry):
    """`python add_tool.py` runs (a script's directory is on the path), so "run it with python"
    showed nothing; tinyrl and export-verl's copy import the file alone. A package beside it too."""
    (tmp_path / "helper.py").write_text("def total(a, b):\n    return a + b\n")
    (tmp_path / "add_tool.py").write_text("import helper\n" + ADD_TOOL)
    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("")
    (tmp_path / "sub_tool.py").write_text("from mylib.maths import sub\n")
    said = _problems(tmp_path, f"task.extra_tools={json.dumps([f'{tmp_path}/add_tool.py:add', f'{tmp_path}/sub_tool.py:sub'])}")
    assert (f"add_tool.py imports 'helper', which is beside it in {tmp_path}: tinyrl imports add_tool.py alone, "
            "without its directory on the import path (so does export-verl's copy of it); put what it uses from "
            "helper into add_tool.py, or install helper as a package") in said, said
    assert "sub_tool.py imports 'mylib', which is beside it" in said
    assert subprocess.run([sys.executable, str(tmp_path / "add_tool.py")]).returncode == 0  # what the user saw work
    assert set(TOOLS) == {"code_interpreter"}


def test_a_registered_file_checked_again_is_no_clash_and_an_edited_one_replaces_its_tool(tmp_path, tool_registry):
    """A config loaded again in the process that registered the tools (a notebook, export-verl
    after a check) is not refused as naming its own tool twice; a file edited since is read again."""
    from tinyrl.tasks import offered_tools

    path = tmp_path / "add_tool.py"
    path.write_text(ADD_TOOL)
    setting = f"task.extra_tools={json.dumps([f'{path}:add'])}"
    cfg = tiny_config(tmp_path, *_hermes(tmp_path), setting)
    assert offered_tools(cfg.task) == ("add",) and offered_tools(cfg.task) == ("add",)
    first = TOOLS["add"]
    assert tiny_config(tmp_path, *_hermes(tmp_path), setting).task.extra_tools == [f"{path}:add"]
    path.write_text(ADD_TOOL.replace("Add two numbers.", "Add two numbers, exactly."))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert offered_tools(cfg.task) == ("add",) and TOOLS["add"] is not first
    assert TOOLS["add"].schema["function"]["description"] == "Add two numbers, exactly."


def test_a_tool_setting_is_read_once_extra_tools_offer_one(tmp_path, tool_registry):
    """rollout.max_turns on a task without tools is noted as unread; with task.extra_tools it is read."""
    from tinyrl.config import load_config

    (tmp_path / "add_tool.py").write_text(ADD_TOOL)
    notes: list[str] = []
    load_config("countdown-tiny", ["rollout.max_turns=3"], notes=notes, check=False)
    assert any("rollout.max_turns is given but this run does not read it" in n and "task.extra_tools" in n
               for n in notes)
    notes.clear()
    load_config("countdown-tiny", ["rollout.max_turns=3", f"task.extra_tools={json.dumps([f'{tmp_path}/add_tool.py:add'])}",
                                   "data.chat_template=true"], notes=notes, check=False)
    assert not [n for n in notes if "max_turns" in n or "extra_tools" in n]


def test_a_run_reads_its_tool_files_from_the_directory_it_started_in(tmp_path, monkeypatch, tool_registry):
    """A relative `file.py:NAME` is the file where the run started (run.json's cwd): `--resume`,
    eval and export-verl from another directory read that one, not one of that name here."""
    from tinyrl.config import config_from_dict, load_config
    from tinyrl.rundir import RUN_FILE, rebase_paths

    start, other = tmp_path / "start", tmp_path / "other"
    start.mkdir(), other.mkdir()
    (start / "add_tool.py").write_text(ADD_TOOL)
    monkeypatch.chdir(start)
    cfg = load_config("countdown-tiny", ['task.extra_tools=["add_tool.py:add"]', "data.chat_template=true"], check=False)
    run = start / "run"
    run.mkdir()
    (run / RUN_FILE).write_text(json.dumps({"cwd": str(start)}))
    monkeypatch.chdir(other)
    moved = config_from_dict(cfg.to_dict())
    rebase_paths(moved, run)
    assert moved.task.extra_tools == [f"{start / 'add_tool.py'}:add"]


def test_export_verl_copies_the_files_and_its_verl_tool_registers_them(tmp_path, monkeypatch, tool_registry):
    """The export is all verl needs: user_tools/add_tool.py beside tinyrl_tool.py, which registers
    it when verl's tool loader imports it (a worker where no `tinyrl` command ran)."""
    import asyncio

    import yaml

    from test_export_verl import retool_export, verl_tool_loader
    from tinyrl.tools import user

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "add_tool.py").write_text(ADD_TOOL)
    out = retool_export(tmp_path, f"task.extra_tools={json.dumps([f'{mine}/add_tool.py:add'])}")
    assert (out / "user_tools" / "add_tool.py").read_text() == ADD_TOOL
    written = yaml.safe_load((out / "tool_config.yaml").read_text())
    assert [t["tool_schema"]["function"]["name"] for t in written["tools"]] == ["code_interpreter", "add"]
    assert "and your task.extra_tools, copied into user_tools/" in (out / "run_verl.sh").read_text()
    (mine / "add_tool.py").unlink()  # verl reads the copy
    TOOLS.pop("add"), user._REGISTERED.clear(), user._MODULES.clear()  # a fresh worker: only tinyrl's own
    loader = verl_tool_loader(monkeypatch)
    monkeypatch.syspath_prepend(str(out))
    tools = {t.name: t for t in loader.initialize_tools_from_config(str(out / "tool_config.yaml"))}
    assert Path(sys.modules[TOOLS["add"].run.__module__].__file__) == out / "user_tools" / "add_tool.py"

    async def call(parameters):
        instance, _ = await tools["add"].create(create_kwargs={})
        try:
            return await tools["add"].execute(instance, parameters)
        finally:
            await tools["add"].release(instance)

    response, _, metrics = asyncio.run(call({"a": 2, "b": 40}))
    assert (response.text, metrics["status"]) == ("42", "ok")


def test_what_a_tool_file_prints_as_it_loads_leaves_a_json_commands_stdout_as_json(tmp_path):
    (tmp_path / "add_tool.py").write_text('print("loading my tools")\n' + ADD_TOOL)
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "estimate-cost", "--preset", "countdown-tools-demo",
                           "--set", 'task.extra_tools=["add_tool.py:add"]', "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["preset"] == "countdown-tools-demo" and "loading my tools" in done.stderr


def test_a_bad_entry_is_one_screen_and_exit_2_from_the_command(tmp_path):
    (tmp_path / "add_tool.py").write_text(ADD_TOOL.replace("def add(arguments, create_kwargs, *, timeout_s, memory_mb)",
                                                           "def add(arguments)"))
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "estimate-cost", "--preset", "countdown-tools-demo",
                           "--set", "model.init_from=", "--set", 'task.extra_tools=["add_tool.py:add"]'],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "task.extra_tools: tinyrl.tools.TOOLS['add'].run cannot be called as call_tool calls it" in done.stderr
    assert "fix each as it says" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) < 25
    # eval's --extra-tool: the same check, before a model loads
    from tinyrl.data.countdown import generate_countdown

    generate_countdown(tmp_path / "data", 16, 8, progress=False)
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", "eval", "no-model-needed", "--task", "countdown",
                           "--data", "data/test.parquet", "--extra-tool", "add_tool.py:add"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "tinyrl.tools.TOOLS['add'].run cannot be called as call_tool calls it" in done.stderr
