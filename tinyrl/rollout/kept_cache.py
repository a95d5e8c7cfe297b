"""The HF engine's session across the turns of episodes with tools (rollout/turns.py): each
episode's KV cache is kept between its turns, so a later turn prefills only the tokens added
since (decode.sample_tokens_kept). The engine (tinyrl.rollout.hf_engine.HFEngine) makes one
with episode_session(); this file imports nothing of it (the engine imports this one).
"""

from __future__ import annotations

from tinyrl.rollout.base import RolloutResult, SamplingSettings
from tinyrl.rollout.decode import RowCache, sample_tokens_kept


class KeptCacheSession:
    """The HF engine across the turns of a batch of episodes (rollout/turns.py), keeping each
    episode's KV cache between turns: `generate(contexts, sampling, keys)` as engine.generate,
    with the same chunks, seeds and RNG draws, so its episodes equal re-prefilling's
    (tests/test_turns_kv.py). The first call (keys None) samples sampling.n episodes per prompt
    and names them 0, 1, ... in result order; a later call continues episodes `keys` (n = 1):
    contexts[i] is episode keys[i]'s whole context, which starts with what its cache holds, and
    only the rest is prefilled. Caches are freed by `retain` (the turn loop keeps those of the
    episodes whose tool calls run) and when an episode is continued (its new cache replaces
    it). They live on the engine's device between turns: each episode's own context, no
    padding (within the memory plan's hf_kv_cache)."""

    def __init__(self, engine) -> None:  # a tinyrl.rollout.hf_engine.HFEngine
        self.engine = engine
        self.kept: dict[int, tuple[list[int], RowCache]] = {}  # key -> (the ids its cache holds, the cache)
        self.prefilled = 0  # real tokens fed to prefills (benchmarks/turn_loop.py prints it)

    def generate(self, contexts: list[list[int]], sampling: SamplingSettings,
                 keys: list[int] | None = None) -> RolloutResult:
        engine = self.engine
        engine._check_adapter()
        first = keys is None
        n = (1 if sampling.greedy else sampling.n) if first else 1
        if first:
            self.kept.clear()
            keys = list(range(len(contexts) * n))
        per_call = max(1, engine.max_batch_sequences // n)  # engine.generate's chunks: the same RNG draws
        result = RolloutResult()
        with engine._sampling_mode(sampling.seed):
            for start in range(0, len(contexts), per_call):
                chunk = contexts[start:start + per_call]
                chunk_keys = keys[start * n:(start + len(chunk)) * n]
                past = None if first else [self._take(k, c) for k, c in zip(chunk_keys, chunk)]
                added = chunk if first else [p.ids for p in past]
                self.prefilled += sum(map(len, added))
                ids, mask = engine._left_padded(added)
                tokens, logprobs, caches = sample_tokens_kept(
                    engine.model, ids, mask, n=n, max_new_tokens=sampling.max_new_tokens, stop_ids=engine.stop_ids,
                    pad_id=engine.pad_id, warpers=engine._warpers(sampling), greedy=sampling.greedy,
                    past=None if first else [p.cache for p in past],
                    generators=engine._generators(sampling, start, len(chunk), n))
                episodes = engine._episodes(chunk, start, n, tokens, logprobs)
                for key, e, cache in zip(chunk_keys, episodes, caches):
                    if cache is not None and e.finished:  # holds its context + tokens before the stop token
                        self.kept[key] = (e.prompt_ids + e.response_ids[:-1], cache)
                result.episodes.extend(episodes)
        return result

    def retain(self, keys: list[int]) -> None:
        """Free the caches of every episode not in `keys`."""
        wanted = set(keys)
        for key in [k for k in self.kept if k not in wanted]:
            del self.kept[key]

    def close(self) -> None:
        """Free every kept cache."""
        self.kept.clear()

    def _take(self, key: int, context: list[int]) -> "_Past":
        """Episode `key`'s cache, checked against its context (a cache of other tokens is a bug)."""
        held, cache = self.kept.pop(key)
        if context[:len(held)] != held or len(context) == len(held):
            raise RuntimeError(f"episode {key}'s context does not extend the {len(held)} tokens its kept "
                               f"KV cache holds")
        return _Past(context[len(held):], cache)


class _Past:
    def __init__(self, ids: list[int], cache: RowCache) -> None:
        self.ids, self.cache = ids, cache
