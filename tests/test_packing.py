"""Padding-free training passes (tinyrl.packing) compute exactly what the padded batch does.

The packed row holds only real tokens with position ids restarting per sequence, and attention
stays inside each sequence; so log-probs, entropies, values and gradients must equal the padded
batch's (to float tolerance), on ragged prompt AND response lengths, with activation
checkpointing on (its recomputation must see the sequence bounds too), and the tokens computed
must equal the real tokens (perf/padding_ratio = 1), less a prompt shared by several rows,
which is computed once.
"""

from __future__ import annotations

import pytest
import torch

from tinyrl.config import load_config
from tinyrl.models import PolicyModels, make_batch
from tinyrl.roles import Role


def _models(tiny_model_dir, finetune: str, checkpointing: bool) -> PolicyModels:
    cfg = load_config("countdown-tiny", [f"model.finetune={finetune}", "model.dtype=fp32",
                                         f"model.gradient_checkpointing={str(checkpointing).lower()}"], check=False)
    torch.manual_seed(0)
    models = PolicyModels(cfg.model, str(tiny_model_dir), torch.device("cpu"))
    with torch.no_grad():  # LoRA B starts at 0 and the value head at 0: move them off zero
        for p in models.actor_parameters() + models.critic_parameters():
            p.add_(0.02 * torch.randn_like(p))
    return models


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 700, (n,), generator=g).tolist() for n in (5, 17, 9, 12, 3)]
    responses = [torch.randint(3, 700, (n,), generator=g).tolist() for n in (4, 1, 13, 7, 10)]
    return make_batch(prompts, responses, pad_id=0)


def _passes(models: PolicyModels, batch, padding_free: bool):
    """Actor log-probs + entropy, reference log-probs, critic values and both roles' gradients."""
    models.cfg.padding_free = padding_free
    models.train(True)
    mask = batch.response_mask
    with models.role(Role.ACTOR):
        lp, ent = models.token_logprobs(Role.ACTOR, batch, 0.9, with_entropy=True)
        ((lp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
    with torch.no_grad():
        ref = models.token_logprobs(Role.REFERENCE, batch)
    with models.role(Role.CRITIC):
        values = models.values(batch)
        ((values * mask) ** 2).sum().backward()
    params = models.actor_parameters() + models.critic_parameters()
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return [t.detach() * mask for t in (lp, ent, ref, values)], grads


@pytest.mark.parametrize("finetune,checkpointing", [("lora", True), ("full", True), ("full", False)])
def test_packed_passes_equal_padded_ones(tiny_model_dir, finetune, checkpointing):
    models = _models(tiny_model_dir, finetune, checkpointing)
    batch = _batch()
    before = list(models.token_counts)
    packed_out, packed_grads = _passes(models, batch, True)
    computed, real = (a - b for a, b in zip(models.token_counts, before))
    assert computed == real == 3 * int(batch.attention_mask.sum())  # actor, reference, critic
    padded_out, padded_grads = _passes(models, batch, False)
    for a, b in zip(packed_out, padded_out):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert all(g.abs().sum() > 0 for g in packed_grads)
    for a, b in zip(packed_grads, padded_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))  # float sums reordered


def _shared_batch():
    """GRPO's layout: 3 samples of one prompt, 2 of another (shuffled, as a mini-batch is), one
    prompt alone, a prompt that is a prefix of another and one as long as another (neither may
    be shared)."""
    g = torch.Generator().manual_seed(5)
    a, b, c, d = (torch.randint(3, 700, (n,), generator=g).tolist() for n in (11, 6, 8, 6))
    prompts = [a, b, a, c, b, a, c[:5], d]
    responses = [torch.randint(3, 700, (n,), generator=g).tolist() for n in (4, 9, 1, 6, 12, 7, 3, 5)]
    return make_batch(prompts, responses, pad_id=0), sum(map(len, responses)) + 11 + 6 + 8 + 5 + 6


@pytest.mark.parametrize("finetune,checkpointing", [("lora", True), ("full", True)])
def test_a_shared_prompt_is_computed_once_and_changes_nothing(tiny_model_dir, finetune, checkpointing):
    models = _models(tiny_model_dir, finetune, checkpointing)
    batch, distinct_tokens = _shared_batch()
    before = list(models.token_counts)
    packed_out, packed_grads = _passes(models, batch, True)
    computed, real = (a - b for a, b in zip(models.token_counts, before))
    assert (computed, real) == (3 * distinct_tokens, 3 * int(batch.attention_mask.sum()))
    padded_out, padded_grads = _passes(models, batch, False)
    for a, b in zip(packed_out, padded_out):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(packed_grads, padded_grads):  # a shared prompt's gradient: the sum over its rows
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))


def test_a_packed_sequence_does_not_see_its_neighbours(tiny_model_dir):
    # Each sequence's log-probs alone equal those it gets packed between others.
    models = _models(tiny_model_dir, "full", False)
    batch = _batch(1)
    with torch.no_grad(), models.role(Role.ACTOR):
        together = models.token_logprobs(Role.ACTOR, batch)
        for i in range(batch.input_ids.shape[0]):
            alone = models.token_logprobs(Role.ACTOR, batch.rows(slice(i, i + 1)))
            torch.testing.assert_close(together[i] * batch.response_mask[i], alone[0] * batch.response_mask[i],
                                       rtol=1e-4, atol=1e-5)


def test_padding_free_micro_batches_count_real_tokens():
    from tinyrl.microbatch import micro_slices

    tokens = [5, 9, 3, 8, 8, 1]
    slices = micro_slices(6, 20, 16, tokens)
    assert [(s.start, s.stop) for s in slices] == [(0, 2), (2, 4), (4, 6)]  # 14, 11, 9 real tokens
    assert [(s.start, s.stop) for s in micro_slices(2, 20, 4, [5, 9])] == [(0, 1), (1, 2)]  # one row each at least
    assert micro_slices(6, 20, 16) == [slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 4), slice(4, 5), slice(5, 6)]


def test_micro_batches_are_cut_between_prompts_when_that_takes_no_more_passes():
    from tinyrl.microbatch import micro_slices

    def cuts(groups, cap, tokens=None, budget=1000):
        tokens = tokens or [5] * len(groups)
        return [(s.start, s.stop) for s in micro_slices(len(groups), 10, budget, tokens, budget // cap, groups)]

    four = [0] * 4 + [1] * 4 + [2] * 4
    assert cuts(four, 5) == [(0, 4), (4, 8), (8, 12)]             # not [0:5] [5:10] [10:12]: as many passes
    assert cuts(four, 3) == [(0, 3), (3, 6), (6, 9), (9, 12)]     # 4-row prompts in 3-row passes: cut inside
    assert cuts([0] * 3 + [1] * 3 + [2] * 3 + [3] * 3, 4) == [(0, 4), (4, 8), (8, 12)]  # cut between: 4 passes, not 3
    assert cuts([0] * 7 + [1] * 2, 4) == [(0, 4), (4, 7), (7, 9)]  # a prompt longer than a pass is cut where it must
    # the token budget cuts too (5 rows fit by count, 14 + 9 tokens do not)
    assert cuts([0, 0, 1, 1, 1], 5, tokens=[7, 7, 3, 3, 3], budget=20) == [(0, 2), (2, 5)]
    assert cuts([0, 0, 1, 1, 1], 5, tokens=[7, 7, 3, 3, 3], budget=20) != \
        [(s.start, s.stop) for s in micro_slices(5, 10, 20, [7, 7, 3, 3, 3], 4)]  # no groups: [0:4] [4:5]


def _accumulating_puts(fn) -> list[tuple[str, int]]:
    """Run fn; -> (op, repeated places) for every index_put with accumulate=True it ran (forward
    and backward: on the CPU autograd runs the backward on this thread, inside the mode)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    puts = {torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
            torch.ops.aten._index_put_impl_.default}
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
            if func in puts and accumulate:
                index = [i for i in args[1] if i is not None]
                if any(i.dtype == torch.bool for i in index):
                    repeats = 0  # a mask names each place once
                else:
                    flat = torch.stack([i.reshape(-1) for i in torch.broadcast_tensors(*index)], 1)
                    repeats = flat.shape[0] - torch.unique(flat, dim=0).shape[0]
                seen.append((str(func), repeats))
            return func(*args, **kwargs)

    with Record():
        fn()
    return seen


def test_a_shared_prompt_is_summed_in_the_same_order_every_run(tiny_model_dir):
    # The backward of advanced indexing (x[idx]) is index_put_(accumulate=True): on the CPU, with
    # 2+ threads and 32,768+ elements, it adds the floats of a repeated index with atomics in
    # whatever order the threads get there (torch 2.13 IndexKernel.cpp). Unpacking a shared
    # prompt that way made its gradient differ in the last bits from run to run, and the demo's
    # RL result with it (seed 2: -1.2 and +22.3 points on the same code). Whether the race shows
    # in a given run is luck, so the test asserts its cause: no packed pass (forward or
    # backward) runs an accumulating put over repeated places. Fails with
    # `return flat[layout.hidden]` in tinyrl.packing.unpack (two such puts, actor and critic,
    # 100 repeated places each).
    models = _models(tiny_model_dir, "lora", True)
    batch, _ = _shared_batch()
    seen = _accumulating_puts(lambda: _passes(models, batch, True))
    # (none runs at all now: the response tokens are gathered and scattered by index too,
    # tinyrl.models.token_logprobs; the mutation above still makes two)
    assert all(repeats == 0 for _, repeats in seen), seen


def _sliding_window_model(tmp_path, sliding: bool):
    """A tiny Qwen2 built here (no download) whose second layer is sliding-window when asked."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=sliding,
                         sliding_window=4, max_window_layers=1)
    path = tmp_path / ("sliding" if sliding else "full")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_a_sliding_window_model_is_refused_by_packed_passes_and_loads_padded(tmp_path, finetune):
    from tinyrl.errors import TinyRLError

    cfg = load_config("countdown-tiny", [f"model.finetune={finetune}", "model.dtype=fp32"], check=False)
    with pytest.raises(TinyRLError) as caught:
        PolicyModels(cfg.model, _sliding_window_model(tmp_path, True), torch.device("cpu"))
    text = caught.value.message + caught.value.hint
    assert "sliding_window = 4" in text and "use_sliding_window = True" in text and "layers [1]" in text
    assert "model.padding_free=false" in text
    cfg.model.padding_free = False  # padded passes: transformers' own sliding-window masks
    PolicyModels(cfg.model, _sliding_window_model(tmp_path, True), torch.device("cpu"))
    cfg.model.padding_free = True   # the same model without a window packs as before
    PolicyModels(cfg.model, _sliding_window_model(tmp_path, False), torch.device("cpu"))
