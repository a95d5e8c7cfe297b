"""HFEngine: transformers generate behind the rollout interface, on the tiny model."""

from __future__ import annotations

import copy

import pytest
import torch

from tinyrl.data.templates import countdown_prompt
from tinyrl.rollout import decode
from tinyrl.rollout.base import SamplingSettings
from tinyrl.rollout.hf_engine import HFEngine


@pytest.fixture(scope="module")
def model(tiny_fp32_model):
    return tiny_fp32_model


@pytest.fixture(scope="module")
def prompts(tok):
    # Different lengths (3 vs 4 numbers, two templates): exercises left padding.
    texts = [
        countdown_prompt([3, 17, 40], 60, "base"),
        countdown_prompt([19, 36, 55, 7], 98, "qwen-instruct"),
        countdown_prompt([8, 2, 91, 44], 5, "base"),
    ]
    return [tok(t)["input_ids"] for t in texts]


def _recompute(model, prompt, response, temperature=1.0):
    """Log-prob of each response token from one unpadded forward pass: [len(response)]."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]


def test_n_completions_per_prompt_grouped_with_logprobs(model, tok, prompts):
    engine = HFEngine(model, tok, "cpu")
    res = engine.generate(prompts, SamplingSettings(n=3, max_new_tokens=24, seed=1))
    assert [c.prompt_index for c in res.episodes] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for c in res.episodes:
        assert c.prompt_ids == prompts[c.prompt_index]  # unpadded
        assert 1 <= len(c.response_ids) <= 24
        assert len(c.logprobs) == len(c.response_ids)
        assert all(lp <= 0.0 for lp in c.logprobs)
        if c.finished:  # stopped on EOS: EOS is the last token and nothing follows it
            assert c.response_ids[-1] == tok.eos_token_id
            assert tok.eos_token_id not in c.response_ids[:-1]
        else:
            assert len(c.response_ids) == 24 and tok.eos_token_id not in c.response_ids
    assert len({tuple(c.response_ids) for c in res.episodes}) > 3  # samples differ


def test_logprobs_are_those_of_the_sampling_distribution(model, tok, prompts):
    engine = HFEngine(model, tok, "cpu")
    res = engine.generate(prompts, SamplingSettings(n=2, temperature=0.7, max_new_tokens=20, seed=3))
    for c in res.episodes:
        expected = _recompute(model, c.prompt_ids, c.response_ids, temperature=0.7)
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_eos_stops_generation(model, tok, prompts):
    engine = HFEngine(model, tok, "cpu")
    res = engine.generate(prompts, SamplingSettings(n=4, max_new_tokens=48, seed=0))
    finished = [c for c in res.episodes if c.finished]
    assert finished, "the warmed-up model ends some samples with EOS within 48 tokens"
    assert all(c.response_ids.count(tok.eos_token_id) == 1 for c in finished)


def test_seed_reproduces_rollouts_and_leaves_global_rng_alone(model, tok, prompts):
    engine = HFEngine(model, tok, "cpu")
    s = SamplingSettings(n=2, max_new_tokens=16, seed=7)
    torch.manual_seed(123)
    a = engine.generate(prompts, s)
    after_a = torch.rand(3)
    torch.manual_seed(123)
    b = engine.generate(prompts, s)
    assert torch.equal(torch.rand(3), after_a)  # the seeded rollout used a forked RNG
    c = engine.generate(prompts, SamplingSettings(n=2, max_new_tokens=16, seed=8))
    ids = lambda r: [x.response_ids for x in r.episodes]  # noqa: E731
    assert ids(a) == ids(b) and [x.logprobs for x in a.episodes] == [x.logprobs for x in b.episodes]
    assert ids(a) != ids(c)


def test_greedy_is_one_argmax_completion_per_prompt(model, tok, prompts):
    engine = HFEngine(model, tok, "cpu")
    res = engine.generate(prompts, SamplingSettings(n=4, greedy=True, max_new_tokens=12))
    assert [c.prompt_index for c in res.episodes] == [0, 1, 2]
    for c in res.episodes:
        expected = _recompute(model, c.prompt_ids, c.response_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
        ids = torch.tensor([c.prompt_ids + c.response_ids])
        with torch.no_grad():
            argmax = model(ids).logits[0, len(c.prompt_ids) - 1 : -1].argmax(-1).tolist()
        assert argmax == c.response_ids


def test_top_p_logprobs_are_renormalised_over_the_nucleus(model, tok, prompts):
    engine = HFEngine(model, tok, "cpu")
    res = engine.generate(prompts[:1], SamplingSettings(n=4, top_p=0.5, max_new_tokens=16, seed=2))
    for c in res.episodes:
        full = _recompute(model, c.prompt_ids, c.response_ids)
        assert (torch.tensor(c.logprobs) >= full - 1e-5).all()
    assert any((torch.tensor(c.logprobs) > _recompute(model, c.prompt_ids, c.response_ids) + 1e-3).any()
               for c in res.episodes)


def test_model_generation_config_does_not_leak_into_sampling(model, tok, prompts):
    # Qwen checkpoints ship top_k / repetition_penalty defaults; the engine must ignore them.
    noisy = copy.deepcopy(model)
    noisy.generation_config.top_k = 1
    noisy.generation_config.repetition_penalty = 5.0
    noisy.generation_config.temperature = 0.1
    res = HFEngine(noisy, tok, "cpu").generate(prompts[:1], SamplingSettings(n=6, max_new_tokens=16, seed=4))
    assert len({tuple(c.response_ids) for c in res.episodes}) > 1
    for c in res.episodes:
        torch.testing.assert_close(
            torch.tensor(c.logprobs), _recompute(model, c.prompt_ids, c.response_ids), atol=1e-4, rtol=0
        )
    assert noisy.generation_config.top_k == 1  # restored


def test_train_mode_and_gradient_checkpointing_survive_generation(model, tok, prompts):
    trainee = copy.deepcopy(model)
    trainee.gradient_checkpointing_enable()
    trainee.config.use_cache = False
    trainee.train()
    res = HFEngine(trainee, tok, "cpu").generate(prompts[:2], SamplingSettings(n=2, max_new_tokens=8, seed=0))
    assert len(res.episodes) == 4
    assert trainee.training and all(m.training for m in trainee.modules())
    assert torch.is_grad_enabled()


def test_peft_actor_adapter_is_sampled_and_sync_is_free(model, tok, prompts):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                                adapter_name="actor")
    peft_model.add_adapter("critic", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    engine = HFEngine(peft_model, tok, "cpu")
    engine.sync_weights(peft_model)
    engine.sleep()
    engine.wake(peft_model)
    res = engine.generate(prompts[:1], SamplingSettings(n=2, max_new_tokens=8, seed=0))
    assert len(res.episodes) == 2
    peft_model.set_adapter("critic")
    with pytest.raises(RuntimeError, match="actor"):
        engine.generate(prompts[:1], SamplingSettings(n=1, max_new_tokens=4))


def test_factory_builds_hf_and_auto_is_hf_without_cuda(model, tok, monkeypatch):
    from tinyrl.errors import TinyRLError
    from tinyrl.rollout.factory import make_engine

    assert isinstance(make_engine("hf", model=model, tokenizer=tok), HFEngine)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert isinstance(make_engine("auto", model=model, tokenizer=tok, model_path="unused"), HFEngine)
    with pytest.raises(TinyRLError) as err:
        make_engine("vlm", model=model, tokenizer=tok)
    assert "hf, vllm, auto" in err.value.hint


def test_auto_on_cuda_without_vllm_is_an_error_not_a_silent_fallback(model, tok, monkeypatch):
    # The memory plan gave vLLM its share of the card: quietly sampling with transformers
    # instead would run another plan than the one printed.
    from tinyrl.errors import TinyRLError
    from tinyrl.rollout import factory

    monkeypatch.setattr(factory, "_vllm_unusable_reason", lambda: "vLLM does not import (no module named vllm)")
    with pytest.raises(TinyRLError) as err:
        factory.make_engine("auto", model=model, tokenizer=tok, model_path="unused", device="cuda")
    assert "rollout.engine=hf" in err.value.hint and "vLLM does not import" in str(err.value)


# -- the actor adapter merged for sampling (issue 20.5) -------------------------------------------

def _trained_actor(model, dtype=torch.float32, scale: float = 0.0005):
    """A peft model as PolicyModels builds it, the actor's lora_B non-zero (a trained adapter:
    at 0.0005 its delta is ~0.26% of a weight (median), and (W + d) - d misses W on ~1.3% of
    the elements, under merged_adapter's 1/32 cap; at 0.05 (26%) on ~24%, over it)."""
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=targets, task_type="CAUSAL_LM")
    peft_model = get_peft_model(copy.deepcopy(model).to(dtype), lora, adapter_name="actor")
    peft_model.add_adapter("critic", lora)
    peft_model.set_adapter("actor")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if ".actor." in name and "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return peft_model


def _base_weights(peft_model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" not in n}


def test_merged_sampling_is_the_unmerged_actor_and_skips_the_lora_layers(model, tok, prompts):
    actor = _trained_actor(model)
    lora_calls = []
    for name, m in actor.named_modules():
        if name.endswith("lora_A.actor"):
            m.register_forward_hook(lambda *_: lora_calls.append(1))
    s = SamplingSettings(n=2, max_new_tokens=20, seed=5)
    merged = HFEngine(actor, tok, "cpu").generate(prompts, s)
    assert not lora_calls, "merged sampling must not run the adapter's own layers"
    unmerged = HFEngine(actor, tok, "cpu", merge_adapter=False).generate(prompts, s)
    assert lora_calls
    assert [c.response_ids for c in merged.episodes] == [c.response_ids for c in unmerged.episodes]
    for m, u in zip(merged.episodes, unmerged.episodes):
        torch.testing.assert_close(torch.tensor(m.logprobs), torch.tensor(u.logprobs), atol=1e-5, rtol=0)
        # ... and both are the log-probs of the trainer's own (unmerged) forward pass
        torch.testing.assert_close(torch.tensor(m.logprobs), _recompute(actor, m.prompt_ids, m.response_ids),
                                   atol=1e-4, rtol=0)
    # the adapter matters: the bare base samples something else
    with actor.disable_adapter():
        bare = HFEngine(actor, tok, "cpu", merge_adapter=False).generate(prompts, s)
    assert max((torch.tensor(b.logprobs) - torch.tensor(m.logprobs)).abs().max().item()
               for b, m in zip(bare.episodes, merged.episodes) if b.response_ids == m.response_ids) > 1e-4


def test_bf16_rollouts_give_the_base_weights_back_bit_for_bit(model, tok, prompts):
    # peft's own unmerge (weight -= delta) does not in bf16: the shared frozen base would drift.
    actor = _trained_actor(model, torch.bfloat16)
    before = _base_weights(actor)
    engine = HFEngine(actor, tok, "cpu")
    for seed in range(3):
        engine.generate(prompts, SamplingSettings(n=2, max_new_tokens=8, seed=seed))
    after = _base_weights(actor)
    assert all(torch.equal(after[n], w) for n, w in before.items())
    assert not any(getattr(m, "merged", False) for m in actor.modules())


def test_the_merge_copies_no_base_weight_and_keeps_only_a_few_fixes_on_its_device(model, tok, prompts):
    # The merge used to copy every adapted weight to host memory and back (5.5 GB for a 3B
    # model, every rollout): now it works in place; what outlives a layer's merge is at most
    # 1/32 of its elements (index + original value), made on the weight's device.
    from torch.utils._python_dispatch import TorchDispatchMode

    from tinyrl.memory.formulas import MERGE_FIX_DENOMINATOR
    from tinyrl.rollout.hf_engine import merged_adapter

    actor = _trained_actor(model, torch.bfloat16)
    before = _base_weights(actor)
    storages = {p.untyped_storage().data_ptr() for n, p in actor.named_parameters() if n in before}
    copies, made = [], []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in ("_to_copy", "clone", "_copy_from") and args[0].untyped_storage().data_ptr() in storages:
                copies.append(name)  # a base weight copied (to the host, or anywhere)
            if name == "copy_" and args[0].untyped_storage().data_ptr() in storages:
                copies.append(name)  # written in place
            if isinstance(out, torch.Tensor):
                made.append(out.device)
            return out

    merge = merged_adapter(actor, "actor")
    with Watch():
        count = merge.__enter__()
    merged_state = {n: p.detach().clone() for n, p in actor.named_parameters() if n in before}
    with Watch():
        merge.__exit__(None, None, None)
    assert count == 14 and made and set(made) == {torch.device("cpu")}
    assert copies.count("copy_") == count  # merged = W + delta written in place, once a layer
    assert not [c for c in copies if c != "copy_"]
    assert any(not torch.equal(merged_state[n], w) for n, w in before.items())  # it did merge
    assert all(torch.equal(p, before[n]) for n, p in actor.named_parameters() if n in before)
    # the fixes themselves: few, and what the merge promised the plan
    from tinyrl.rollout.hf_engine import _merge_layer, _mergeable_lora_layers

    with torch.no_grad():
        for layer in _mergeable_lora_layers(actor, "actor"):
            weight = layer.get_base_layer().weight
            original = weight.detach().clone()
            where, values = _merge_layer(layer, "actor")
            assert where.device == values.device == weight.device
            assert where.numel() * MERGE_FIX_DENOMINATOR <= weight.numel()
            weight.sub_(layer.get_delta_weight("actor").to(weight.dtype))
            weight.view(-1)[where] = values
            assert torch.equal(weight, original)


def test_a_failed_rollout_still_restores_the_base(model, tok, prompts, monkeypatch):
    actor = _trained_actor(model, torch.bfloat16)
    before = _base_weights(actor)
    engine = HFEngine(actor, tok, "cpu")
    seen_merged = []

    def boom(*args, **kwargs):
        seen_merged.append(any(not torch.equal(p, before[n]) for n, p in actor.named_parameters() if n in before))
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(engine, "_generate_chunk", boom)
    with pytest.raises(RuntimeError, match="simulated"):
        engine.generate(prompts, SamplingSettings(n=1, max_new_tokens=4, seed=0))
    assert seen_merged == [True]  # the failure happened while merged
    assert all(torch.equal(p, before[n]) for n, p in actor.named_parameters() if n in before)
    assert not any(getattr(m, "merged", False) for m in actor.modules())


def test_after_a_rollout_the_actor_adapter_trains_and_nothing_else_has_gradients(model, tok, prompts):
    actor = _trained_actor(model)
    flags = {n: p.requires_grad for n, p in actor.named_parameters()}
    actor.train()
    HFEngine(actor, tok, "cpu").generate(prompts, SamplingSettings(n=2, max_new_tokens=8, seed=0))
    assert {n: p.requires_grad for n, p in actor.named_parameters()} == flags
    ids = torch.tensor([prompts[0]])
    actor(ids).logits.float().logsumexp(-1).mean().backward()
    for name, p in actor.named_parameters():
        if ".actor." in name and "lora_" in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name


def test_unmergeable_adapters_keep_the_unmerged_path(model, tok, prompts):
    from tinyrl.rollout.hf_engine import merged_adapter

    actor = _trained_actor(model)
    with merged_adapter(actor, "actor") as count:
        assert count == 14  # 2 layers x 7 targets
    with merged_adapter(actor, "critic") as count:
        assert count == 0  # not the active adapter: merging it would sample the wrong policy
    with actor.disable_adapter(), merged_adapter(actor, "actor") as count:
        assert count == 0
    with merged_adapter(model, "actor") as count:  # a plain model (full fine-tuning)
        assert count == 0
    # an adapter too large for exact fixes within the cap stays on peft's own (exact) path
    with merged_adapter(_trained_actor(model, scale=0.05), "actor") as count:
        assert count == 0


def _generate_reference(model, tok, prompts, s: SamplingSettings, stop_ids):
    """What the engine did before its own decode loop: transformers `generate` with the same
    warpers and a recorder of log_softmax(scores) placed last. -> [(tokens, log-probs)] per row."""
    from transformers import (GenerationConfig, LogitsProcessorList, TemperatureLogitsWarper,
                              TopPLogitsWarper)

    steps = []

    def record(input_ids, scores):
        steps.append(torch.log_softmax(scores.float(), -1))
        return scores

    n = 1 if s.greedy else s.n
    procs = [] if s.greedy else [TemperatureLogitsWarper(s.temperature)] * (s.temperature != 1.0) + \
        [TopPLogitsWarper(s.top_p)] * (s.top_p < 1.0)
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    neutral = {} if s.greedy else {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    config = GenerationConfig(do_sample=not s.greedy, num_return_sequences=n, max_new_tokens=s.max_new_tokens,
                              eos_token_id=stop_ids, pad_token_id=tok.pad_token_id, **neutral)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(s.seed or 0)
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                             logits_processor=LogitsProcessorList(procs + [record]))
    gen = out[:, width:]
    rows = []
    for r in range(gen.shape[0]):
        toks = gen[r].tolist()
        end = next((i + 1 for i, t in enumerate(toks) if t in stop_ids), len(toks))
        lps = [steps[i][r, t].item() for i, t in enumerate(toks[:end])]
        rows.append((toks[:end], lps))
    return rows


def _compactions(lengths: list[int], finished: list[bool], max_new_tokens: int) -> list[int]:
    """The batch sizes the decode loop shrinks to, from the rows' lengths: it drops the finished
    rows once at most half of the rows in the batch still sample (decode._sample). The sampled
    lengths depend on the CPU's float kernels (AVX2 and AVX-512 sample differently), so the
    test derives them from the reference instead of naming them."""
    shrinks, batch = [], len(lengths)
    for step in range(max_new_tokens):
        live = sum(not (done and n <= step + 1) for n, done in zip(lengths, finished))
        if not live:
            break
        if live <= batch // 2:
            shrinks.append(live)
            batch = live
    return shrinks


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("settings", [
    SamplingSettings(n=3, max_new_tokens=24, seed=11),
    SamplingSettings(n=2, temperature=0.7, top_p=0.9, max_new_tokens=24, seed=12),
    SamplingSettings(n=1, greedy=True, max_new_tokens=40),
], ids=["t1", "t0.7-p0.9", "greedy"])
def test_decode_loop_gives_generates_tokens_and_logprobs(model, tok, prompts, settings, attention, monkeypatch):
    # The engine's own loop (prefill once per prompt, preallocated KV cache, ready-made masks,
    # finished rows dropped from the batch; eager attention keeps transformers' masks and the
    # whole batch) draws the same RNG numbers from the same distribution as generate: same
    # tokens, same log-probs, for every row.
    m = copy.deepcopy(model)
    m.config._attn_implementation = attention
    engine = HFEngine(m, tok, "cpu")
    kept = []  # rows kept each time the batch shrinks
    select = decode._Preallocated.select
    monkeypatch.setattr(decode._Preallocated, "select", lambda layer, keep: (kept.append(len(keep)), select(layer, keep)))
    got = engine.generate(prompts, settings).episodes
    want = _generate_reference(m, tok, prompts, settings, engine.stop_ids)
    assert [c.response_ids for c in got] == [w[0] for w in want]
    if settings.seed == 11 and attention == "sdpa":  # the rows still sampling go on alone (once per layer)
        shrinks = _compactions([len(w[0]) for w in want], [bool(w[0]) and w[0][-1] in engine.stop_ids for w in want],
                               settings.max_new_tokens)
        assert shrinks and kept == [n for n in shrinks for _ in range(m.config.num_hidden_layers)]
    if settings.seed == 11:  # rows that stop early and rows cut at max_new_tokens, in one batch
        assert any(c.finished for c in got) and any(not c.finished for c in got)
    for c, (_, lps) in zip(got, want):
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(lps), atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention", ["sdpa", "tinyrl_packed"])
def test_decode_steps_never_copy_kv_to_every_query_head(model, tok, prompts, attention, monkeypatch):
    # The tiny model has 2 query heads on 1 kv head (GQA). transformers' sdpa copies K/V to all
    # heads (repeat_kv) whenever a mask is given: with the decode loop's padded-key mask that was
    # every layer at every step (2.46 GB a layer for a 3B rollout of 256 rows on CUDA). Only the
    # prefill may do it now (once per layer, K and V), whatever the number of steps.
    from transformers.integrations import sdpa_attention

    from tinyrl.packing import use_packed_attention

    m = copy.deepcopy(model)
    if attention == "sdpa":
        m.config._attn_implementation = "sdpa"
    else:
        use_packed_attention(m)
    calls = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: (calls.append(x.shape), real(x, n))[1])
    result = HFEngine(m, tok, "cpu").generate(prompts, SamplingSettings(n=2, max_new_tokens=12, seed=3))
    assert max(len(c.response_ids) for c in result.episodes) > 2  # several decode steps ran
    layers = m.config.num_hidden_layers
    assert len(calls) == 2 * layers and all(shape[0] == len(prompts) for shape in calls)  # the prefill's
    assert m.config._attn_implementation == attention  # restored after the rollout


def test_grouped_decode_attention_is_transformers_sdpa_with_repeated_kv():
    # 6 query heads on 2 kv heads (query head h reads kv head h // 3), padded keys masked per row
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g) for shape in ((4, 6, 1, 8), (4, 2, 9, 8), (4, 2, 9, 8)))
    mask = torch.arange(9)[None, None, None, :] >= torch.tensor([0, 3, 5, 8])[:, None, None, None]  # [4, 1, 1, 9]
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    got, _ = decode._grouped_decode_attention(module, q, k, v, mask, scaling=0.3)
    assert got.shape == want.shape == (4, 1, 6, 8)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_sampling_a_subset_of_rows_uses_the_whole_batchs_draws():
    # The decode loop's sampler is torch.multinomial's own one-sample algorithm: on the whole
    # batch it gives multinomial's tokens and leaves the RNG where multinomial does; on the rows
    # still sampling it gives those rows' tokens of the whole batch.
    probs = torch.softmax(torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3, -1)
    rows = torch.tensor([1, 4, 5])
    for seed in range(20):
        torch.manual_seed(seed)
        want, after = torch.multinomial(probs, 1)[:, 0], torch.rand(2)
        torch.manual_seed(seed)
        assert torch.equal(decode._multinomial(probs, torch.arange(6), 6), want)
        assert torch.equal(torch.rand(2), after)
        torch.manual_seed(seed)
        assert torch.equal(decode._multinomial(probs[rows], rows, 6), want[rows])


def test_nan_logits_stop_the_rollout_with_a_hint(model, tok, prompts):
    from tinyrl.errors import TinyRLError

    m = copy.deepcopy(model)
    with torch.no_grad():
        m.model.norm.weight[0] = float("nan")  # every hidden state, so every logit, is NaN
    with pytest.raises(TinyRLError, match="NaN") as e:
        HFEngine(m, tok, "cpu").generate(prompts, SamplingSettings(n=2, max_new_tokens=4, seed=1))
    assert "actor.lr" in e.value.hint


@pytest.mark.parametrize("policy, decode_threads", [("PASSIVE", 1), ("passive", 1), ("ACTIVE", 2), (None, 2)])
def test_decode_steps_take_one_thread_only_while_openmp_threads_sleep(model, tok, prompts, monkeypatch,
                                                                      policy, decode_threads):
    # Sleeping OpenMP threads (PASSIVE) make every small op of a decode step pay their wake-up,
    # so the steps run on one thread; the prefill keeps them all, and so does everything after.
    if policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []
    m = copy.deepcopy(model)
    m.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    try:
        HFEngine(m, tok, "cpu").generate(prompts, SamplingSettings(n=2, max_new_tokens=6, seed=1))
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert seen[0] == 2 and len(seen) > 2  # the prefill, then the decode steps
    assert set(seen[1:]) == {decode_threads}
    assert after == 2


def test_a_failing_decode_step_gives_the_threads_back(model, tok, prompts, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    m = copy.deepcopy(model)
    calls = []

    def fail_on_second_call(*_):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a decode step fails")

    m.register_forward_pre_hook(fail_on_second_call)
    try:
        with pytest.raises(RuntimeError, match="a decode step fails"):
            HFEngine(m, tok, "cpu").generate(prompts, SamplingSettings(n=2, max_new_tokens=6, seed=1))
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert after == 2
