"""The HF engine's kept KV cache across turns (KeptCacheSession, decode.sample_tokens_kept):
a later turn prefills only the tokens added since the last one, on top of each episode's kept
cache, and must give exactly what re-prefilling the whole grown context gives (engine.generate
with the same seed): the same tokens and the same log-probs to 1e-5. The turn loop's own
episodes are compared the same way in tests/test_turns_engines.py (the taught model)."""

from __future__ import annotations

import inspect
import random

import pytest
import torch

from tinyrl.data.templates import countdown_prompt
from tinyrl.rollout.base import SamplingSettings
from tinyrl.rollout.hf_engine import HFEngine
from tinyrl.rollout.kept_cache import KeptCacheSession


@pytest.fixture(scope="module")
def prompts(tok):
    # different lengths: left padding in the first prefill
    return [tok(countdown_prompt(nums, target, template))["input_ids"] for nums, target, template in
            [([3, 17, 40], 60, "base"), ([19, 36, 55, 7], 98, "qwen-instruct"), ([8, 2, 91, 44], 5, "base")]]


def _same(kept, ref) -> None:
    assert [e.response_ids for e in kept.episodes] == [e.response_ids for e in ref.episodes]
    for a, b in zip(kept.episodes, ref.episodes):
        assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0.0) < 1e-5, (a.logprobs, b.logprobs)


@pytest.mark.parametrize("batch", [256, 4])  # 4: turn 1 one prompt (x 3) per chunk, later turns 4 rows per chunk
def test_kept_cache_turns_equal_reprefilled_turns(tiny_fp32_model, tok, prompts, batch):
    """Three turns over 3 prompts x n = 3: after each, the episodes that stopped (their stop
    token sampled, not yet fed) get 1-9 inserted tokens (a tool turn's stand-in, a different
    length per row) and every other one of them goes on, so rows differ in kept length, in
    added length and in the turn they stop at, and rows leave the decode batch mid-turn."""
    engine = HFEngine(tiny_fp32_model, tok, "cpu", max_batch_sequences=batch)
    reference = HFEngine(tiny_fp32_model, tok, "cpu", max_batch_sequences=batch, keep_context_cache=False)
    assert engine.keeps_context_cache and not reference.keeps_context_cache
    session = engine.episode_session()
    assert isinstance(session, KeptCacheSession) and reference.episode_session() is None
    rng = random.Random(0)
    sampling = SamplingSettings(n=3, temperature=1.0, max_new_tokens=40, seed=7)
    first = session.generate(prompts, sampling)
    _same(first, reference.generate(prompts, sampling))
    contexts = {k: e.prompt_ids + e.response_ids for k, e in enumerate(first.episodes) if e.finished}
    assert len({len(e.response_ids) for e in first.episodes}) > 3  # rows stop at different steps
    continued = 0
    for turn in (2, 3):
        keys = sorted(contexts)[::2]  # some stopped episodes go on, the others end here
        grown = [contexts[k] + [rng.randrange(10, 400) for _ in range(rng.randint(1, 9))] for k in keys]
        later = SamplingSettings(n=1, temperature=1.0, max_new_tokens=30, seed=100 + turn)
        session.retain(keys)  # as the turn loop does before the tool calls run
        assert set(session.kept) == set(keys)
        kept = session.generate(grown, later, keys)
        _same(kept, reference.generate(grown, later))
        continued += len(keys)
        contexts = {k: c + e.response_ids for k, c, e in zip(keys, grown, kept.episodes) if e.finished}
        assert set(session.kept) == set(contexts)  # what stopped keeps its cache, the rest is freed
    assert continued >= 4
    # only the added tokens were prefilled after turn 1
    session.retain([])
    assert not session.kept


def test_a_context_that_does_not_extend_the_kept_cache_is_refused(tiny_fp32_model, tok, prompts):
    session = HFEngine(tiny_fp32_model, tok, "cpu").episode_session()
    first = session.generate(prompts, SamplingSettings(n=3, max_new_tokens=40, seed=7))
    key = next(k for k, e in enumerate(first.episodes) if e.finished)
    e = first.episodes[key]
    wrong = [e.prompt_ids[:-1] + [e.prompt_ids[-1] + 1] + e.response_ids + [5]]
    with pytest.raises(RuntimeError, match="does not extend"):
        session.generate(wrong, SamplingSettings(n=1, greedy=True, max_new_tokens=5), [key])


def test_prefill_counts_only_the_added_tokens(tiny_fp32_model, tok, prompts):
    session = HFEngine(tiny_fp32_model, tok, "cpu").episode_session()
    first = session.generate(prompts, SamplingSettings(n=2, greedy=False, max_new_tokens=40, seed=1))
    assert session.prefilled == sum(map(len, prompts))  # each prompt once for its n samples
    keys = [k for k, e in enumerate(first.episodes) if e.finished][:2]
    grown = [first.episodes[k].prompt_ids + first.episodes[k].response_ids + [11, 12, 13] for k in keys]
    session.generate(grown, SamplingSettings(n=1, max_new_tokens=5, seed=2), keys)
    assert session.prefilled == sum(map(len, prompts)) + 4 * len(keys)  # the stop token + 3 added each


def test_kept_caches_are_each_episodes_own_context_as_the_plan_prices(tiny_fp32_model, tok, prompts, tiny_model_dir):
    """Between turns (while the tools run) the card holds, per episode that goes on, the K/V of
    its own context and nothing else: L tokens x formulas.kv_bytes_per_token, no padding, no
    copy of the batch's buffers. So the rollout's hf_kv_cache part (every episode at its whole
    length, memory/plan.py _hf_generate_parts) bounds it."""
    from tinyrl.memory import formulas as fm
    from tinyrl.memory.plan import _hf_generate_parts
    from tinyrl.model_specs import load_spec

    spec = load_spec(str(tiny_model_dir))
    session = HFEngine(tiny_fp32_model, tok, "cpu").episode_session()
    first = session.generate(prompts, SamplingSettings(n=3, max_new_tokens=40, seed=7))
    assert session.kept
    for key, (ids, cache) in session.kept.items():
        e = first.episodes[key]
        assert ids == e.prompt_ids + e.response_ids[:-1] and cache.length == len(ids)
        held = sum(t.untyped_storage().nbytes() for kv in cache.layers for t in kv)
        assert held == len(ids) * fm.kv_bytes_per_token(spec, "fp32")  # each tensor its own storage
    longest = max(map(len, prompts)) + 40
    parts = _hf_generate_parts(spec, len(first.episodes), longest, len(prompts), max(map(len, prompts)),
                               {"finetune": "full"}, multi_turn=True)
    kept = sum(len(ids) for ids, _ in session.kept.values()) * fm.kv_bytes_per_token(spec, "fp32")
    assert kept <= parts["hf_kv_cache"] * fm.dtype_bytes("fp32") // fm.dtype_bytes("bf16")


def test_a_row_with_its_own_seed_samples_the_same_in_any_batch(tiny_fp32_model, tok, prompts):
    """seeds_per_prompt: a row's tokens depend on its context and its seed, not on which rows
    share the call or where it sits (the turn loop's later turns come in timing-made batches)."""
    engine = HFEngine(tiny_fp32_model, tok, "cpu")
    seeds = [11, 22, 33]
    together = engine.generate(prompts, SamplingSettings(n=1, max_new_tokens=30, seed=1, seeds_per_prompt=seeds))
    backwards = engine.generate(prompts[::-1], SamplingSettings(n=1, max_new_tokens=30, seed=2,
                                                                seeds_per_prompt=seeds[::-1]))
    alone = [engine.generate([p], SamplingSettings(n=1, max_new_tokens=30, seed=3, seeds_per_prompt=[s]))
             for p, s in zip(prompts, seeds)]
    assert len({tuple(e.response_ids) for e in together.episodes}) == 3
    for i, e in enumerate(together.episodes):
        assert e.response_ids == backwards.episodes[2 - i].response_ids == alone[i].episodes[0].response_ids
        assert max(abs(a - b) for a, b in zip(e.logprobs, alone[i].episodes[0].logprobs)) < 1e-5
    # and the same holds on the kept-cache path (the turn loop's later turns)
    session = engine.episode_session()
    first = session.generate(prompts, SamplingSettings(n=2, max_new_tokens=40, seed=7))
    keys = [k for k, e in enumerate(first.episodes) if e.finished][:3]
    assert len(keys) >= 2
    grown = [first.episodes[k].prompt_ids + first.episodes[k].response_ids + [11, 12] for k in keys]
    seeds = [100 + k for k in keys]
    batch = session.generate(grown, SamplingSettings(n=1, max_new_tokens=20, seeds_per_prompt=seeds), keys)
    ref = HFEngine(tiny_fp32_model, tok, "cpu", keep_context_cache=False)
    for k, c, s, e in zip(keys, grown, seeds, batch.episodes):
        one = ref.generate([c], SamplingSettings(n=1, max_new_tokens=20, seeds_per_prompt=[s])).episodes[0]
        assert one.response_ids == e.response_ids


def test_later_turns_are_seeded_by_episode_not_by_batch():
    """The turn loop's seed for an episode's next turn is episode_seed(seed, its key, turn),
    the same whichever episodes share the generate call."""
    from tinyrl.rollout.turns import _continue, _Live, episode_seed
    from tinyrl.rollout.base import Episode

    class Recording:
        def __init__(self):
            self.seen = {}

        def generate(self, contexts, settings, keys):
            self.seen.update(zip(keys, settings.seeds_per_prompt))
            return type("R", (), {"episodes": [Episode.single_turn(0, c, [1], [0.0], True) for c in contexts]})()

    class Chat:
        tokenizer = type("T", (), {"decode": staticmethod(lambda ids, **kw: "x")})()

    def lives():
        out = []
        for key in range(4):
            live = _Live(0, [5, 6], key=key)
            live.add_assistant([7, 1], [0.0, 0.0], True, "call")
            live.add_tool([8, 9], ["out"])
            out.append(live)
        return out

    all_at_once, one_by_one = Recording(), Recording()
    _continue(all_at_once, lives(), SamplingSettings(seed=9, max_new_tokens=50), 50, Chat(), {1})
    for live in lives()[::-1]:
        _continue(one_by_one, [live], SamplingSettings(seed=9, max_new_tokens=50), 50, Chat(), {1})
    assert all_at_once.seen == one_by_one.seen == {k: episode_seed(9, k, 2) for k in range(4)}
    assert len(set(all_at_once.seen.values())) == 4


def test_the_kv_cache_goes_in_under_the_keyword_the_models_forward_takes(tiny_fp32_model):
    # transformers 5.24 renamed the forward's `past_key_values` to `cache` (the old name warns,
    # 5.40 removes it, and then the forward's **kwargs would swallow it: every decode step would
    # see a fresh cache and attend only to itself). The decode loop reads the name off the class.
    from tinyrl.rollout.decode import _cache_kwarg, _forward_cache_kwarg

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, **kwargs): ...

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, **kwargs): ...

    assert _forward_cache_kwarg(New) == "cache"
    assert _forward_cache_kwarg(Old) == "past_key_values"

    class Wrapped(torch.nn.Module):  # a LoRA actor: peft's forward takes **kwargs, its base names the keyword
        def forward(self, *args, **kwargs): ...

        def get_base_model(self):
            return New()

    assert _cache_kwarg(Wrapped()) == "cache"
    name = _cache_kwarg(tiny_fp32_model)        # the installed transformers' own model
    assert name in inspect.signature(type(tiny_fp32_model).forward).parameters
