"""The rollout interface: prompts in, episodes (token ids, which of them the policy sampled, the
engine's log-probs) out.

Engines: `hf` (transformers generate, everywhere) and `vllm` (vLLM offline LLM, in-process).
The trainer only talks to this interface; vLLM is imported only in vllm_engine.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class SamplingSettings:
    n: int = 1                    # episodes per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    greedy: bool = False          # validation: temperature 0, n = 1
    seed: int | None = None
    # Per prompt, a smaller limit than max_new_tokens (the turn loop: budgets left differ per
    # episode); an engine may honour it (vLLM) or decode to max_new_tokens (the caller cuts).
    max_new_tokens_per_prompt: list[int] | None = None
    # Per prompt (n = 1), its own sampling seed, used instead of `seed`: its tokens then do not
    # depend on the other prompts of the call (the turn loop continues episodes in batches that
    # tool timings decide: rollout/turns.py episode_seed). HF: a generator per row; vLLM: the
    # request's seed.
    seeds_per_prompt: list[int] | None = None


@dataclass(frozen=True)
class Turn:
    """One span of an episode's tokens: `response_ids[start:end]`, said by `role`."""

    role: str                     # "assistant" (sampled by the policy) | "tool" | ... (inserted context)
    start: int
    end: int


STOP_REASONS = ("stop", "length", "max_turns")  # EOS / max_new_tokens / the turn limit

# How a tool call ended. "ok": it ran and exited 0; the others are still a tool turn that says
# what happened (never an exception): the code failed or ran too long, or the call itself was
# malformed (not JSON / no such tool / bad arguments), or it went past rollout.max_tool_calls.
TOOL_CALL_STATUSES = ("ok", "error", "timeout", "bad_call", "unknown_tool", "over_limit")
# ToolCall.message's length at most: the head of what the tool turn said (an exception's text can be long)
TOOL_MESSAGE_CHARS = 200

# How an episode with tools compares with a full re-render of its conversation (prompt messages,
# each assistant turn's text, the tool messages; tinyrl.rollout.chat.ToolChat.rerender).
# "same": the same tokens. "tokens": the same text in other tokens -- the policy sampled a split
# of its text that the tokenizer would not make (an untrained or hot model does); harmless, the
# sampled tokens are the ones trained. "text": the text itself differs, so the episode's tool
# turns or template text were written wrongly -- a fault to report. "" : not checked (single-turn).
RERENDER_OUTCOMES = ("", "same", "tokens", "text")


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an episode, as the metrics, the samples and a task's reward see it."""

    name: str                     # the tool asked for ("" when the call could not be parsed)
    status: str                   # one of TOOL_CALL_STATUSES
    seconds: float                # wall clock of the run (0.0 when nothing ran)
    turn: int                     # index into Episode.turns of the assistant turn that made it
    # why a call that is not "ok" failed, as its tool turn says it (ToolResult.message: "error: tool
    # 'x' raised RuntimeError: ...", "exit code 1: ...", "timed out: ..."; a call not run: what was
    # wrong), its first TOOL_MESSAGE_CHARS characters; kept when the budget leaves no room for the
    # tool turn, so samples.jsonl always says it. "" for an ok call
    message: str = ""


@dataclass
class Episode:
    """One sample: everything after the prompt, and which of those tokens the policy sampled.

    A single-turn completion is the one-turn case (`Episode.single_turn`): one assistant turn,
    an all-ones policy mask. Tokens with policy_mask 0 (a tool's output, any inserted text) are
    context for the tokens after them and are never trained on (tinyrl.trajectory.Trajectory.mask).
    """

    prompt_index: int             # index into the list of prompts passed to generate()
    prompt_ids: list[int]
    response_ids: list[int]       # the whole episode after the prompt; a last assistant turn ends with EOS when it stopped by itself
    policy_mask: list[int]        # [len(response_ids)] 1 = sampled by the policy, 0 = inserted context
    logprobs: list[float] | None  # [len(response_ids)] the engine's log-prob of each policy token, 0.0 at
                                  # inserted ones (verl pads tool tokens the same way); None if not given
    turns: list[Turn]             # in order, covering response_ids
    stop_reason: str              # one of STOP_REASONS
    tool_calls: list[ToolCall] = field(default_factory=list)  # in order; empty for a single-turn episode
    rerender: str = ""            # one of RERENDER_OUTCOMES

    def __post_init__(self):
        n = len(self.response_ids)
        if len(self.policy_mask) != n or (self.logprobs is not None and len(self.logprobs) != n):
            raise ValueError(f"episode of {n} tokens has a policy mask of {len(self.policy_mask)} and "
                             f"{None if self.logprobs is None else len(self.logprobs)} log-probs")
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason {self.stop_reason!r} is not one of {STOP_REASONS}")
        if self.rerender not in RERENDER_OUTCOMES:
            raise ValueError(f"rerender {self.rerender!r} is not one of {RERENDER_OUTCOMES}")

    @classmethod
    def single_turn(cls, prompt_index: int, prompt_ids: list[int], response_ids: list[int],
                    logprobs: list[float] | None, finished: bool) -> "Episode":
        """A plain completion: one assistant turn, every token sampled by the policy."""
        n = len(response_ids)
        return cls(prompt_index, list(prompt_ids), list(response_ids), [1] * n, logprobs,
                   [Turn("assistant", 0, n)], "stop" if finished else "length")

    @property
    def finished(self) -> bool:
        """True: the episode ended by itself (EOS in its last turn), not at a length or turn limit."""
        return self.stop_reason == "stop"


def response_texts(tokenizer, episodes: list[Episode]) -> list[str]:
    """Each episode's text after the prompt (inserted turns included), as rewards and logs read it."""
    return tokenizer.batch_decode([e.response_ids for e in episodes], skip_special_tokens=True)


@dataclass
class RolloutResult:
    episodes: list[Episode] = field(default_factory=list)  # grouped: n per prompt, in order


class RolloutEngine(Protocol):
    name: str

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings) -> RolloutResult:
        """Sample `sampling.n` episodes per prompt; results grouped by prompt, in order."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine serve the trainer's current actor (adapters or merged weights)."""

    def sleep(self) -> None:
        """Free the card for training (vLLM sleep mode on CUDA); a no-op where unsupported."""

    def wake(self, model: torch.nn.Module | None = None) -> None:
        """Take the card back before a rollout; with `model`, sync weights between the
        weights and KV-cache wake-ups (vLLM's required order)."""

    def close(self) -> None:
        """Release the engine."""
