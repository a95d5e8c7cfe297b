"""`tinyrl eval` with tools: a task that declares tools is evaluated as episodes (prompts list
the tools' schemas, tool calls run in the sandbox), each sample keeps its turns and tool calls,
and pass@k is computed as without tools. --no-tools gives the single-turn path."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from helpers.hermes_template import HERMES_TEMPLATE
from helpers.scripted_engine import ScriptedEngine
from helpers.tool_task import give_tools
from tinyrl import eval as ev
from tinyrl.errors import TinyRLError
from tinyrl.tasks import math as mt


def _call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


@pytest.fixture
def math_with_tools(monkeypatch):
    give_tools(monkeypatch, "math")


def test_eval_keeps_whole_episodes(tmp_path, tiny_model_dir, monkeypatch, math_with_tools):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = HERMES_TEMPLATE
    tok.save_pretrained(model)
    _, test = mt.generate(tmp_path / "d", 4, 6, template="dapo")
    seen: list[str] = []

    def script(context: str, j: int) -> str:
        seen.append(context)
        return _call(f"print({j} + 1)") if "<tool_response>" not in context else "Answer: 1"

    monkeypatch.setattr(ev, "_engine", lambda kind, path, tok, *a: ScriptedEngine(tok, script))
    summary, out = ev.evaluate(str(model), [f"gen={test}"], task_name="math", n=2, ks=[1, 2], engine="hf",
                               out_dir=tmp_path / "out", progress=False)
    assert summary["tools"] == ["code_interpreter"]
    assert all('"name": "code_interpreter"' in c for c in seen)  # every prompt lists the tool's schema
    samples = [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6 * (2 + 1)
    for s in samples:
        assert [t["role"] for t in s["turns"]] == ["assistant", "tool", "assistant"] and s["stop_reason"] == "stop"
        assert [c["status"] for c in s["tool_calls"]] == ["ok"]
        assert f"<tool_response>\n{s['sample'] + 1 if s['kind'] == 'sample' else 1}\n</tool_response>" in s["turns"][1]["text"]
        assert s["completion"].endswith("Answer: 1") and s["rerender"] == "same"
    m = summary["files"]["gen"]
    assert (m["tools/calls"], m["tools/errors"], m["episode/turns"], m["episode/tokenization_mismatch"]) == (18.0, 0.0, 2.0, 0.0)
    assert ev.metrics_from_samples(out / "eval_samples.jsonl", [1, 2])["gen"] == \
        {k: v for k, v in m.items() if k[:4] in ("pass", "mean", "maj@")}

    seen.clear()
    summary, out = ev.evaluate(str(model), [f"gen={test}"], task_name="math", n=2, ks=[1, 2], engine="hf",
                               out_dir=tmp_path / "plain", progress=False, tools=False, chat_template=False)
    assert "tools" not in summary and "tools/calls" not in summary["files"]["gen"]
    assert "tools (code_interpreter) were left out (--no-tools)" in summary["tools_left_out"]  # said, with why
    assert not any("code_interpreter" in c for c in seen)
    plain = [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]
    assert "turns" not in plain[0]
    with pytest.raises(TinyRLError, match="chat template"):
        ev.evaluate(str(model), [f"gen={test}"], task_name="math", n=2, ks=[1], engine="hf",
                    out_dir=tmp_path / "x", progress=False, tools=True, chat_template=False)


def test_eval_hands_each_episode_to_a_reward_that_reads_it(tiny_model_dir):
    """A reward that takes `episode` (retool's tool-error penalty, a function of one's own that
    reads Episode.tool_calls) gets the sample's episode in eval as in train and validation
    (RewardSet.score_batch(episodes=...)); eval passed none, so such a reward read None: a
    function using it raised, retool's judged without its penalty."""
    from types import SimpleNamespace

    from tinyrl.config import RolloutConfig
    from tinyrl.rollout.turns import ToolRollout
    from tinyrl.tasks.rewards import RewardSet

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = HERMES_TEMPLATE

    def script(context: str, j: int) -> str:
        return _call("print(1)") * j if "<tool_response>" not in context else "Answer: 1"

    def calls_made(completion, row, episode):  # a reward of one's own that reads the episode
        return float(len(episode.tool_calls))

    engine = ScriptedEngine(tok, script)
    rollout = ToolRollout(("code_interpreter",), tok, engine, RolloutConfig(tool_timeout_s=5.0))
    rows = [{"prompt": [{"role": "user", "content": "task 0: go"}]}]
    prompts = [rollout.chat.render(rows[0]["prompt"], generation_prompt=True)]
    common = dict(n=3, ks=[1], temperature=1.0, top_p=1.0, greedy=False, max_new_tokens=200, seed=1,
                  tool_rollout=rollout)
    judged = ev.score_prompts(engine, tok, prompts, rows, None, None, judge=RewardSet([("calls", calls_made)], [], 1.0),
                              **common)
    assert [s["reward"] for s in judged.samples] == [0.0, 1.0, 2.0]
    task = SimpleNamespace(make_reward=lambda cfg: calls_made, solved_at=lambda cfg: 1.0,
                           extract_answer=lambda text, cfg: None)
    by_task = ev.score_prompts(engine, tok, prompts, rows, task, None, **common)
    assert [s["reward"] for s in by_task.samples] == [0.0, 1.0, 2.0]
