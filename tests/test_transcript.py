"""samples.jsonl keeps whole episodes: Trainer._keep_sample on hand-built episodes (the turn
loop that makes them is tinyrl.rollout.turns), decoded by the tiny model's real tokenizer."""

import io
import json
from types import SimpleNamespace

import torch
from rich.console import Console

from tinyrl.dashboard import Dashboard
from tinyrl.rollout.base import Episode, ToolCall, Turn, response_texts
from tinyrl.rollout.transcript import transcript
from tinyrl.trainer import Trainer

CALL = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(44 + 35 + 19)"}}\n</tool_call>'
TURNS = [("assistant", " Let me add them.\n" + CALL),
         ("tool", "\n<tool_response>\n98 [bold]\x1b[31m\n</tool_response>\n"),
         ("assistant", " 98 it is</think>\n<answer> 44 + 35 + 19 </answer>")]


def tool_episode(tok) -> Episode:
    """assistant (a call) -> tool (its reply, inserted) -> assistant (the answer, then EOS)."""
    ids, turns, mask = [], [], []
    for role, text in TURNS:
        part = tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if text is TURNS[-1][1] else [])
        turns.append(Turn(role, len(ids), len(ids) + len(part)))
        ids += part
        mask += [int(role == "assistant")] * len(part)
    return Episode(0, tok.encode("Using the numbers [44, 19, 35], make 98.", add_special_tokens=False), ids, mask,
                   [-0.5 * m for m in mask], turns, "stop",
                   [ToolCall("code_interpreter", "ok", 0.123, 0)])


def keep(tok, episodes, log_samples=4):
    """Trainer._keep_sample on a stand-in trainer: what it writes, and what the dashboard gets."""
    written = []
    fake = SimpleNamespace(cfg=SimpleNamespace(trainer=SimpleNamespace(log_samples=log_samples)),
                           inputs=SimpleNamespace(tokenizer=tok), run=SimpleNamespace(sample=written.append),
                           _last_sample=None)
    Trainer._keep_sample(fake, 6, episodes, response_texts(tok, episodes), torch.tensor([1.0, 0.1][:len(episodes)]))
    return written, fake._last_sample


def test_a_tool_episode_is_kept_whole_turns_in_order_with_its_calls(tok):
    ep = tool_episode(tok)
    single = Episode.single_turn(1, [5, 6], tok.encode(" 1 + 2</think>", add_special_tokens=False), None, False)
    written, last = keep(tok, [ep, single])
    rec = json.loads(json.dumps(written[0]))  # as a reader of samples.jsonl gets it
    assert rec["turns"] == [{"role": role, "text": text, "tokens": t.end - t.start}
                            for (role, text), t in zip(TURNS, ep.turns)]
    assert rec["tool_calls"] == [{"name": "code_interpreter", "status": "ok", "seconds": 0.123, "turn": 0,
                                 "message": ""}]
    assert rec["stop_reason"] == "stop" and rec["step"] == 7 and rec["reward"] == 1.0
    # today's fields stay, and the turns joined are the completion the reward read
    assert rec["completion"] == "".join(t["text"] for t in rec["turns"])
    assert rec["prompt"] == "Using the numbers [44, 19, 35], make 98."
    # a single-turn episode: one assistant turn holding the completion, no calls
    one = written[1]
    assert one["turns"] == [{"role": "assistant", "text": " 1 + 2</think>", "tokens": len(single.response_ids)}]
    assert one["tool_calls"] == [] and one["stop_reason"] == "length" and one["completion"] == " 1 + 2</think>"
    assert last is written[0]
    assert keep(tok, [ep, single], log_samples=1)[0] == written[:1]


def test_the_kept_record_is_what_the_dashboard_draws(tok):
    _, last = keep(tok, [tool_episode(tok)])
    d = Dashboard({"total_steps": 10}, mode="off")
    d.update({"step": 7}, last)
    c = Console(file=io.StringIO(), width=100, record=True, color_system=None)
    c.print(d.render())
    text = c.export_text()
    assert "2 model turns · 1 tool call" in text and "╭─ tool · code_interpreter ok 0.12s" in text
    assert "│ │ 98 [bold]\\x1b[31m" in text and "<answer> 44 + 35 + 19 </answer>" in text


def test_transcript_of_an_episode_without_turns_is_empty():
    ep = Episode(0, [1], [], [], None, [], "length")
    assert transcript(None, ep) == {"turns": [], "tool_calls": [], "stop_reason": "length", "rerender": ""}
