"""Hostile code inside tool calls: each snippet ends as a tool turn within its limit, while a
real training step of the tiny model runs beside the episodes (another thread) and completes.

The policy is scripted (its first turn is the hostile call); the turn loop, the sandbox, the
chat template and the trainer are the real ones. Bounds on seconds are loose (a busy 2-core
machine): they catch a kill that never came, not a slow one."""

from __future__ import annotations

import json
import math
import os
import threading

from transformers import AutoTokenizer

from helpers.hermes_template import HERMES_TEMPLATE
from helpers.scripted_engine import ScriptedEngine
from tinyrl.rollout.base import SamplingSettings
from tinyrl.rollout.chat import ToolChat
from tinyrl.rollout.turns import EpisodeLimits, run_episodes
from tinyrl.tools import TOOLS, procs

TIMEOUT_S = 3.0
SLACK_S = 20.0
SECRET = "tinyrl-turns-secret-51d2"

# (code, statuses it may end with, words its tool turn must hold)
HOSTILE = [
    ("while True: pass", {"timeout"}, f"timed out after {TIMEOUT_S:g} s"),  # rollout.tool_timeout_s reached the sandbox
    ("import os\nwhile True:\n    os.fork()", {"timeout", "error"}, "["),
    ("while True: print('x' * 1000)", {"error", "timeout"}, "["),
    ("b = bytearray(10 * 2**30)", {"error"}, "MemoryError"),
    ("import os; os.kill(os.getppid(), 9); print('alive')", {"ok", "error"}, ""),
    ("import os; os.killpg(0, 9)", {"error"}, "SIGKILL"),
    ("import subprocess; subprocess.Popen(['sleep', '1000']); print('left one')", {"ok"}, "left one"),
    ("import os; print(os.environ.get('HF_TOKEN', 'no token'))", {"ok"}, "no token"),
]


def _call(code: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


def _script(context: str, j: int) -> str:
    if "<tool_response>" in context:
        return "done"
    return _call(HOSTILE[int(context.split("snippet ")[-1].split("<")[0])][0])


def _alive_descendants() -> set[int]:
    return procs.descendants(os.getpid(), [p for p in procs.processes() if not p.zombie])


def test_hostile_tool_calls_end_as_tool_turns_beside_a_training_step(tmp_path, monkeypatch, tiny_model_dir):
    from test_trainer import tiny_config
    from tinyrl.trainer import Trainer

    monkeypatch.setenv("HF_TOKEN", SECRET)
    trainer = Trainer(tiny_config(tmp_path), tmp_path / "run")
    before = _alive_descendants()
    step: dict = {}

    def train():
        try:
            step["metrics"] = trainer.train_step()
        except BaseException as e:  # noqa: BLE001 -- handed to the main thread, which fails on it
            step["error"] = e

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = HERMES_TEMPLATE
    chat = ToolChat(tok, [TOOLS["code_interpreter"].schema], [tok.eos_token_id])
    msgs = [[{"role": "user", "content": f"snippet {i}"}] for i in range(len(HOSTILE))]
    beside = threading.Thread(target=train)
    beside.start()
    res = run_episodes(ScriptedEngine(tok, _script), [chat.render(m, True) for m in msgs],
                       SamplingSettings(n=1, max_new_tokens=600), chat=chat,
                       tools={"code_interpreter": TOOLS["code_interpreter"]},
                       limits=EpisodeLimits(tool_timeout_s=TIMEOUT_S, tool_workers=4), messages=msgs)
    beside.join()

    assert "error" not in step, step.get("error")
    assert step["metrics"]["step"] == 1 and math.isfinite(step["metrics"]["actor/pg_loss"])
    for e, (code, statuses, words) in zip(res.episodes, HOSTILE):
        (made,) = e.tool_calls
        assert made.status in statuses, (code, made)
        assert made.seconds < TIMEOUT_S + SLACK_S, (code, made)
        assert [t.role for t in e.turns] == ["assistant", "tool", "assistant"] and e.stop_reason == "stop", code
        tool = e.turns[1]
        text = tok.decode(e.response_ids[tool.start:tool.end])
        assert words in text and SECRET not in text, (code, text)
    assert {e.rerender for e in res.episodes} == {"same"}
    assert _alive_descendants() <= before  # nothing a snippet started outlived its call
