
import pytest

import tinyrl  # noqa: F401  (before transformers/peft)
from tinyrl.errors import TinyRLError
from tinyrl.memory import formulas as fm
from tinyrl.memory import simulate as sim

# Qwen2-shaped, small enough that a fake trace takes well under a second.
SMALL = dict(model_type="qwen2", vocab_size=32000, hidden_size=256, intermediate_size=704,
             num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             tie_word_embeddings=True, max_position_embeddings=4096, rms_norm_eps=1e-6,
             rope_theta=10000.0)
KW = dict(response_len=128, lora_rank=16, logprob_chunk=256)


pytestmark = pytest.mark.usefixtures("plan_cache")


def test_resident_parts_match_the_formulas():
    r = sim.simulate_phase(SMALL, "forward", 2, 256, **KW)
    lora = fm.lora_param_count(SMALL, 16)
    trainable = 2 * lora + fm.value_head_params(SMALL)        # adapters "actor" and "critic"
    assert r["adapters"] == 4 * trainable                     # peft keeps adapters in fp32
    # Both Adams: 8 bytes/param, plus a 4-byte `step` tensor per parameter tensor.
    assert r["optimizer"] == pytest.approx(fm.adam_state_bytes(trainable), rel=0.001)
    assert r["gradients"] == 0                                # no grads in a no-grad phase
    # The base in bf16 plus RoPE's fp32 inverse frequencies (a buffer per layer).
    assert r["base_weights"] == pytest.approx(fm.weight_bytes(SMALL), rel=0.001)
    parts = sum(v for k, v in r.items() if k not in ("peak", "logprob_chunk"))
    assert parts == r["peak"]


def test_full_finetune_holds_three_models_and_fp32_adam():
    r = sim.simulate_phase(SMALL, "actor_update", 2, 256, finetune="full", **KW)
    w = fm.weight_bytes(SMALL)
    assert r["base_weights"] == pytest.approx(w, rel=0.001)    # the frozen reference
    assert r["adapters"] == pytest.approx(2 * w, rel=0.001)    # actor + critic (+ value head)
    assert r["optimizer"] >= 2 * 4 * w                         # two Adams, fp32 moments (tinyrl.optim)


def test_extrapolation_from_two_layers_matches_a_full_depth_trace():
    for phase in sim.PHASES:
        step = sim.Step(phase, 2, 256, 128, lora_rank=16, logprob_chunk=256)
        full = max(r["total"] for r in sim.trace_step(SMALL, step, 6)["regions"].values())
        parts = sim.simulate_phase(SMALL, phase, 2, 256, **KW)
        extrapolated = parts["peak"] - parts["allocator"]  # the headroom is not a traced tensor
        assert extrapolated == pytest.approx(full, rel=0.02), phase


def test_checkpointing_and_chunking_lower_the_peak():
    on = sim.simulate_phase(SMALL, "actor_update", 8, 512, **KW)
    off = sim.simulate_phase(SMALL, "actor_update", 8, 512, gradient_checkpointing=False, **KW)
    assert off["activations"] > 1.5 * on["activations"]
    big_chunk = sim.simulate_phase(SMALL, "actor_update", 8, 512, **{**KW, "logprob_chunk": 1024})
    assert big_chunk["peak"] > on["peak"]
    # The traced chunk agrees with the closed form (bf16: 20 bytes per logit with backward).
    assert on["logprob_chunk"] == pytest.approx(fm.logprob_chunk_bytes(256, 32000, backward=True), rel=0.01)
    ref = sim.simulate_phase(SMALL, "forward", 8, 512, **KW)
    assert ref["logprob_chunk"] == pytest.approx(fm.logprob_chunk_bytes(256, 32000), rel=0.01)


def test_traces_are_cached_on_disk(monkeypatch):
    sim.simulate_phase(SMALL, "critic_update", 3, 256, **KW)

    def no_build(*a, **k):
        raise AssertionError("traced again")

    monkeypatch.setattr(sim, "build_models", no_build)
    again = sim.simulate_phase(SMALL, "critic_update", 3, 256, **KW)
    assert again["peak"] > 0
    with pytest.raises(AssertionError):
        sim.simulate_phase(SMALL, "critic_update", 5, 256, **KW)  # a new shape is traced


def test_fit_max_micro_batch_returns_the_boundary():
    def peak(b):
        return sim.simulate_phase(SMALL, "actor_update", b, 256, **KW)["peak"]

    budget = (peak(5) + peak(6)) // 2
    assert sim.fit_max_micro_batch(SMALL, "actor_update", budget, 256, max_micro_batch=64, **KW) == 5
    assert sim.fit_max_micro_batch(SMALL, "actor_update", peak(1) - 1, 256, **KW) == 0
    assert sim.fit_max_micro_batch(SMALL, "actor_update", 10**12, 256, max_micro_batch=3, **KW) == 3


def test_bad_shapes_are_user_errors():
    with pytest.raises(TinyRLError):
        sim.simulate_phase(SMALL, "rollout", 1, 256, **KW)
    with pytest.raises(TinyRLError):
        sim.simulate_phase(SMALL, "actor_update", 1, 128, **KW)  # response must be shorter
    with pytest.raises(TinyRLError):  # an SFT step trains the actor alone
        sim.simulate_phase(SMALL, "actor_update", 1, 256, sft=True, **KW)


def test_an_sft_step_is_traced_through_the_sft_trainers_own_loss(monkeypatch, tmp_path):
    """The SFT plan (`tinyrl sft` on a card, probe-memory of an SFT preset) traces the pass the SFT
    trainer runs: its loss function, log-probs without PPO's entropy, the actor alone."""
    import tinyrl.learners as learners

    real, calls = learners.sft_loss_fn, []

    def counting():
        loss = real()

        def counted(models, part):
            calls.append(tuple(part.mask.shape))
            return loss(models, part)
        return counted

    monkeypatch.setattr(learners, "sft_loss_fn", counting)
    monkeypatch.setenv("TINYRL_CACHE", str(tmp_path))  # traced here, not read from another test's trace
    alone = dict(critic=False, reference=False, **KW)
    sft = sim.simulate_phase(SMALL, "actor_update", 4, 256, sft=True, with_entropy=False, **alone)
    assert calls == [(4, 128)] * 2  # one micro-step, at each of the two traced depths
    ppo = sim.simulate_phase(SMALL, "actor_update", 4, 256, **alone)
    assert sft["gradients"] == ppo["gradients"] and sft["adapters"] == ppo["adapters"]  # the same actor


@pytest.mark.parametrize("phase, name", [("actor_update", "actor_loss_fn"), ("critic_update", "critic_loss_fn")])
def test_an_rl_update_is_traced_through_the_trainers_own_loss(monkeypatch, tmp_path, phase, name):
    """The plan's actor and critic updates run tinyrl.learners' loss functions, the ones the
    Learner back-propagates, not a hand-written twin of them (which it was until 2026-11-27)."""
    import tinyrl.learners as learners

    real, calls = getattr(learners, name), []

    def counting(cfg):
        loss = real(cfg)

        def counted(models, part):
            calls.append(tuple(part.mask.shape))
            return loss(models, part)
        return counted

    monkeypatch.setattr(learners, name, counting)
    monkeypatch.setenv("TINYRL_CACHE", str(tmp_path))  # traced here, not read from another test's trace
    sim.simulate_phase(SMALL, phase, 4, 256, **KW)
    assert calls == [(4, 128)] * 2  # one micro-step, at each of the two traced depths
