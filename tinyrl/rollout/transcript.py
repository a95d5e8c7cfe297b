"""An episode as a person reads it: its turns as text, in order, and its tool calls.

What `samples.jsonl` keeps of each logged sample (Trainer._keep_sample) and what the dashboard's
sample panel draws from. Text is decoded as `response_texts` decodes the whole response
(special tokens dropped), turn by turn, so the turns' texts joined are the `completion` the
reward read. A single-turn episode is one assistant turn and no tool calls. `eval_samples.jsonl`
keeps the same record of each tool episode (tinyrl.eval).
"""

from __future__ import annotations

from dataclasses import asdict

from tinyrl.rollout.base import Episode


def transcript(tokenizer, episode: Episode) -> dict:
    """-> {"turns": [{"role", "text", "tokens"}], "tool_calls": [{"name", "status", "seconds", "turn",
    "message"}], "stop_reason", "rerender"}; `turn` of a call indexes "turns" (the assistant turn that
    made it), `message` says why a call that is not ok failed (ToolCall.message);
    "rerender" is Episode.rerender ("" where no re-render was made)."""
    spans = [episode.response_ids[t.start:t.end] for t in episode.turns]
    texts = tokenizer.batch_decode(spans, skip_special_tokens=True) if spans else []
    return {"turns": [{"role": t.role, "text": text, "tokens": t.end - t.start}
                      for t, text in zip(episode.turns, texts)],
            "tool_calls": [asdict(c) for c in episode.tool_calls],
            "stop_reason": episode.stop_reason, "rerender": episode.rerender}
