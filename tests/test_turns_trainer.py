"""The trainer with a task that declares tools: prompts list the tools' schemas, rollouts,
dynamic sampling and validation go through the turn loop, the step reports the tool metrics;
a tool task without the chat template is refused before anything loads."""

from __future__ import annotations

import json

import pytest

from helpers.hermes_template import HERMES_TEMPLATE
from helpers.scripted_engine import ScriptedEngine
from helpers.tool_task import give_tools
from test_trainer import tiny_config
from tinyrl.errors import TinyRLError
from tinyrl.rollout.turns import ToolRollout
from tinyrl.trainer import Trainer


@pytest.fixture
def countdown_with_tools(monkeypatch):
    give_tools(monkeypatch, "countdown")


def _call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


def _script(context: str, j: int) -> str:
    if "<tool_response>" not in context:
        return "let me check " + _call(f"print({j} % 2)")
    # answers differ by the tool's output: rewards of a group differ (dynamic sampling keeps it)
    return "<answer> 1 + 2 </answer>" if "\n1\n</tool_response>" in context else "no idea"


def _trainer(tmp_path, *extra) -> Trainer:
    (tmp_path / "hermes.jinja").write_text(HERMES_TEMPLATE)
    cfg = tiny_config(tmp_path, "data.chat_template=true", f"model.custom_chat_template={tmp_path / 'hermes.jinja'}",
                      "rollout.max_response_length=160", "data.max_prompt_length=600", "trainer.test_every=1",
                      "data.max_test_prompts=4", *extra)
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.engine = ScriptedEngine(trainer.inputs.tokenizer, _script)  # the policy stand-in
    trainer.tool_rollout = ToolRollout(trainer.inputs.tools, trainer.inputs.tokenizer, trainer.engine, cfg.rollout)
    return trainer


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_step_with_tools(tmp_path, countdown_with_tools, dynamic):
    trainer = _trainer(tmp_path, f"algorithm.dynamic_sampling={str(dynamic).lower()}")
    assert trainer.inputs.tools == ("code_interpreter",)
    prompt = trainer.inputs.tokenizer.decode(trainer.inputs.train_prompts[0])
    assert '"name": "code_interpreter"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    m = trainer.train_step()
    n_episodes = trainer.cfg.trainer.train_batch_size * trainer.cfg.rollout.n
    rounds = m.get("batch/gen_rounds", 1)
    assert m["tools/calls"] == n_episodes and m["episode/turns"] == 2.0
    assert (m["tools/errors"], m["tools/timeouts"], m["episode/tokenization_mismatch"]) == (0.0, 0.0, 0.0)
    assert 0 < m["tools/seconds"] and m["reward/mean"] > -1
    if dynamic:
        assert m["batch/groups_kept"] == trainer.cfg.trainer.train_batch_size and rounds == 1
    calls = len(trainer.engine.calls)
    v = trainer.validate()
    new = [c for c, _ in trainer.engine.calls[calls:]]  # greedy episodes: two turns each
    assert "val/score" in v and new[0] == 4 and sum(new[1:]) == 4


def test_single_turn_task_reports_no_tool_metrics(tmp_path):
    trainer = Trainer(tiny_config(tmp_path), tmp_path / "run")
    assert trainer.tool_rollout is None and trainer.inputs.tools == ()
    m = trainer.train_step()
    assert not [k for k in m if k.startswith(("tools/", "episode/"))]


def test_a_tool_task_needs_the_chat_template(tmp_path, countdown_with_tools):
    with pytest.raises(TinyRLError, match="set data.chat_template=true"):
        tiny_config(tmp_path)

