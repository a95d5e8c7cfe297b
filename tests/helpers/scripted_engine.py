"""A policy stand-in for turn-loop tests: an engine (the RolloutEngine interface) whose
assistant turns are given by a script instead of sampled. Everything around it -- the turn
loop, the chat template, the sandbox, the trainer's math -- is the real code."""

from __future__ import annotations

from typing import Callable

from tinyrl.rollout.base import Episode, RolloutResult, SamplingSettings


class ScriptedEngine:
    """`script(context_text, sample_index) -> the assistant turn's text`; each turn ends with the
    tokenizer's EOS (a turn that stopped by itself) unless the budget cuts it. No log-probs
    (an engine may give none: the trainer's parity guard then has nothing to compare).
    `tokenize(text) -> ids`: the turn's tokens (default: the tokenizer's own split; another
    split of the same text is what a sampling policy may produce)."""

    name = "scripted"
    multi_turn = True

    def __init__(self, tokenizer, script: Callable[[str, int], str], tokenize: Callable[[str], list[int]] | None = None):
        self.tokenizer, self.script = tokenizer, script
        self.tokenize = tokenize or (lambda text: tokenizer(text, add_special_tokens=False)["input_ids"])
        self.stop_ids = [tokenizer.eos_token_id]
        self.calls: list[tuple[int, int]] = []   # (contexts, max_new_tokens) per generate call
        self.seeds: list[int | None] = []        # sampling.seed per generate call
        self.row_seeds: list[list[int] | None] = []  # sampling.seeds_per_prompt per generate call

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings) -> RolloutResult:
        n = 1 if sampling.greedy else sampling.n
        self.calls.append((len(prompt_ids), sampling.max_new_tokens))
        self.seeds.append(sampling.seed)
        self.row_seeds.append(sampling.seeds_per_prompt)
        out = RolloutResult()
        for i, prompt in enumerate(prompt_ids):
            context = self.tokenizer.decode(prompt, skip_special_tokens=False)
            for j in range(n):
                ids = self.tokenize(self.script(context, j))
                ids = (ids + self.stop_ids)[:sampling.max_new_tokens]
                out.episodes.append(Episode.single_turn(i, prompt, ids, None,
                                                        finished=ids[-1] in self.stop_ids))
        return out

    def sync_weights(self, model) -> None:
        pass

    def sleep(self) -> None:
        pass

    def wake(self, model=None) -> None:
        pass

    def close(self) -> None:
        pass
