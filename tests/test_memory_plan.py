import math

import pytest

import tinyrl  # noqa: F401  (before transformers/peft)
from tinyrl.errors import TinyRLError
from tinyrl.hardware import GiB, get_gpu
from tinyrl.memory import formulas as fm
from tinyrl.memory import simulate as sim
from tinyrl.memory.plan import MemoryPlan, build_plan
from tinyrl.model_specs import load_spec

SMALL = dict(model_type="qwen2", vocab_size=32000, hidden_size=256, intermediate_size=704,
             num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             tie_word_embeddings=True, max_position_embeddings=4096, rms_norm_eps=1e-6,
             rope_theta=10000.0)


pytestmark = pytest.mark.usefixtures("plan_cache")


def _kv_holds_every_running_sequence(plan, spec, seq):
    kv_seq = fm.kv_bytes_per_token(spec) * math.ceil(seq / 16) * 16
    assert plan.vllm_share["kv_cache"] >= plan.vllm_max_num_seqs * kv_seq
    assert sum(plan.vllm_share.values()) <= plan.vllm_gpu_memory_utilization * plan.card_bytes


def test_headline_3b_lora_ppo_fits_a_4090_in_every_phase():
    """Qwen2.5-3B, LoRA actor + critic on one base, prompt 256 + response 1024, 256 prompts
    per step, 16 sequences (20,480 tokens) per micro-batch: every phase <= 90% of the card."""
    spec = load_spec("Qwen/Qwen2.5-3B")
    plan = build_plan(spec, gpu=get_gpu("rtx4090"), prompt_len=256, response_len=1024,
                      prompts_per_step=256, mini_batch_prompts=64, lora_rank=64, micro_batch=16)
    assert plan.fits and plan.simulated
    assert set(plan.phases) == {"rollout", "forward", "actor_update", "critic_update"}
    for name, phase in plan.phases.items():
        assert phase.peak <= 0.9 * 24 * GiB, name
        assert phase.peak == sum(phase.parts.values())
    assert plan.phases["actor_update"].parts["base_weights"] == pytest.approx(fm.weight_bytes(spec), rel=0.001)
    assert 1 <= plan.vllm_max_num_seqs <= 256
    _kv_holds_every_running_sequence(plan, spec, 1280)


def test_headline_05b_full_ppo_needs_more_than_12_gib():
    """Qwen2.5-0.5B as the verl run had it (full actor, full critic, reference copy), 32 prompts
    of 256 + 256 tokens. The trainer's AdamW keeps fp32 moments for bf16 weights: 7.4 GiB of
    state for actor + critic, so 12 GiB cannot hold an update (the H100 run of issue 20 reached
    14.42 GiB); the preset plans into 18 GiB."""
    spec = load_spec("Qwen/Qwen2.5-0.5B")
    kw = dict(gpu=get_gpu("rtx4090"), prompt_len=256, response_len=256, prompts_per_step=32,
              mini_batch_prompts=16, finetune="full", micro_batch=8)
    assert not build_plan(spec, budget_bytes=12 * GiB, **kw).fits
    plan = build_plan(spec, budget_bytes=18 * GiB, **kw)
    assert plan.fits
    assert all(p.peak <= 18 * GiB for p in plan.phases.values())
    assert plan.vllm_max_num_seqs == 32
    _kv_holds_every_running_sequence(plan, spec, 512)


def test_chosen_micro_batches_are_the_largest_that_fit():
    budget = fm.CUDA_CONTEXT_BYTES + fm.CUBLAS_WORKSPACES_BYTES + 150 * 2**20
    # 40 prompts: without a critic, a forward of 32 sequences fits 150 MiB (33 do)
    plan = build_plan(SMALL, gpu=get_gpu("rtx4090"), prompt_len=128, response_len=128,
                      prompts_per_step=40, lora_rank=16, logprob_chunk=128, engine="hf",
                      critic=False, budget_bytes=budget)
    assert plan.fits and plan.budget_bytes == budget
    common = dict(response_len=128, lora_rank=16, logprob_chunk=128, critic=False)  # as planned
    assert "critic_update" not in plan.phases
    for name, phase in (("actor_update", "actor_update"), ("forward", "forward")):
        b = plan.phases[name].micro_batch
        assert 1 <= b < 40, name  # chosen by the budget, not by the cap
        assert plan.phases[name].token_budget == b * 256
        assert plan.phases[name].peak <= budget
        over = sim.simulate_phase(SMALL, phase, b + 1, 256, **common)["peak"]
        assert over + fm.CUDA_CONTEXT_BYTES + fm.CUBLAS_WORKSPACES_BYTES > budget


# Two cuBLAS handles' workspaces on sm90, written out (not the constant): the main thread's and
# autograd's backward thread's, 32 MiB + cuBLASLt's 1 MiB each.
WORKSPACES = 2 * (32 + 1) * 2**20


@pytest.mark.parametrize("preset, simulate", [("countdown-0.5b-4090", True), ("retool-sft-4090", False)])
def test_every_phase_counts_the_cublas_workspaces_as_allocated(preset, simulate):
    """torch's allocator holds cuBLAS's workspaces for the whole run: on an H200 (2026) the forward
    and rollout of countdown-0.5b-4090 measured 50-80 MiB above a plan without them."""
    from tinyrl.config import load_config
    from tinyrl.memory.from_config import categories, plan_dict, plan_for_config, planned_phases
    from tinyrl.memory.versus import OUTSIDE_PARTS, run_plan_record

    cfg = load_config(preset)
    plan = plan_for_config(cfg, get_gpu(cfg.cost.gpu), simulate=simulate)
    assert sorted(plan.phases) == sorted(planned_phases(cfg))
    record, cats = run_plan_record(plan_dict(cfg, plan))["phases"], categories(cfg, plan)
    for name, ph in plan.phases.items():
        assert ph.parts["cublas_workspaces"] == WORKSPACES, name
        trainer = sum(v for k, v in ph.parts.items() if k not in (*OUTSIDE_PARTS, "allocator", "cublas_workspaces"))
        assert record[name]["planned_allocated_bytes"] >= trainer + WORKSPACES, name
        assert cats[name]["runtime context"] >= WORKSPACES and cats[name]["other"] == 0, name


def test_plan_round_trips_through_json():
    plan = build_plan(SMALL, gpu=get_gpu("rtx4090"), prompt_len=128, response_len=128,
                      prompts_per_step=8, micro_batch=2, lora_rank=16, logprob_chunk=256)
    again = MemoryPlan.from_json(plan.to_json())
    assert again == plan
    assert again.phases["actor_update"].micro_batch == 2
    assert [r[0] for r in plan.rows()] == ["rollout", "forward", "actor_update", "critic_update"]


def test_what_does_not_fit_says_so():
    spec = load_spec("Qwen/Qwen2.5-7B")
    plan = build_plan(spec, gpu=get_gpu("rtx4090"), prompt_len=256, response_len=1024,
                      prompts_per_step=64, finetune="full", micro_batch=1, critic=False)
    assert not plan.fits
    assert not plan.phases["actor_update"].fits  # 3 x 15 GB of bf16 weights alone
    assert "critic_update" not in plan.phases
    with pytest.raises(TinyRLError):
        build_plan(spec, gpu=get_gpu("rtx4090"), prompt_len=8, response_len=8, prompts_per_step=1,
                   finetune="full", quantize="nf4")


def test_nf4_and_offloading_make_room_for_more_kv_cache():
    spec = load_spec("Qwen/Qwen2.5-3B")
    kw = dict(gpu=get_gpu("rtx4090"), prompt_len=256, response_len=1024, prompts_per_step=256,
              lora_rank=64, micro_batch=4, simulate=False)
    plain = build_plan(spec, **kw)
    nf4 = build_plan(spec, quantize="nf4", engine="hf", **kw)  # vLLM cannot load an NF4 base
    offload = build_plan(spec, offload_optimizer_in_rollout=True, **kw)
    assert not plain.simulated
    assert nf4.phases["actor_update"].parts["base_weights"] < plain.phases["actor_update"].parts["base_weights"] / 2
    assert nf4.phases["rollout"].parts["trainer_weights"] < plain.phases["rollout"].parts["trainer_weights"] / 2
    with pytest.raises(TinyRLError, match="vLLM"):
        build_plan(spec, quantize="nf4", engine="vllm", **kw)
    assert offload.phases["rollout"].parts["trainer_optimizer"] == 0
    assert offload.vllm_max_num_seqs > plain.vllm_max_num_seqs


def test_the_hf_rollout_counts_its_decode_transients_and_merge_fixes():
    # 3B rollout of 256 sequences of 1,174 tokens with the hf engine: the sampling temporaries
    # (1,011,286,016 bytes, formulas.sampling_bytes) and merged_adapter's fixes are in the plan
    spec = load_spec("Qwen/Qwen2.5-3B")
    plan = build_plan(spec, gpu=get_gpu("rtx4090"), prompt_len=150, response_len=1024, prompts_per_step=32,
                      rollout_n=8, engine="hf", micro_batch=1, simulate=False)
    parts = plan.phases["rollout"].parts
    assert parts["hf_decode_transient"] == fm.hf_decode_transient_bytes(spec, 256, 1174, expands_kv=False)
    assert parts["hf_merge_fixes"] == fm.merge_fix_bytes(spec)
    assert plan.phases["rollout"].peak == sum(parts.values())
    full = build_plan(spec, gpu=get_gpu("rtx4090"), prompt_len=150, response_len=1024, prompts_per_step=32,
                      rollout_n=8, engine="hf", micro_batch=1, simulate=False, finetune="full")
    assert "hf_merge_fixes" not in full.phases["rollout"].parts  # nothing merged without adapters


def test_a_multi_turn_hf_rollout_prices_the_tool_turns_prefill_into_each_episode():
    """Tool turns are prefilled into each episode's own context (the n samples of a prompt no
    longer share it): the K/V copy over every episode and the whole sequence (3B, 256 episodes
    of 1,174 tokens: 2,462,056,448 bytes, formulas.kv_expansion_bytes), which outgrows a decode
    step's transient; the lengths themselves were already at their limit."""
    spec = load_spec("Qwen/Qwen2.5-3B")
    kw = dict(gpu=get_gpu("rtx4090"), prompt_len=150, response_len=1024, prompts_per_step=32, rollout_n=8,
              engine="hf", micro_batch=1, simulate=False)
    single, multi = build_plan(spec, **kw), build_plan(spec, multi_turn=True, **kw)
    one, many = single.phases["rollout"].parts, multi.phases["rollout"].parts
    assert many["hf_turn_prefill_transient"] == fm.kv_expansion_bytes(spec, 256, 1174) == 2_462_056_448
    assert "hf_decode_transient" not in many  # they never overlap: the larger one is the peak
    assert multi.phases["rollout"].peak - single.phases["rollout"].peak == \
        many["hf_turn_prefill_transient"] - one["hf_decode_transient"] > 0
    assert many["hf_kv_cache"] == one["hf_kv_cache"] == 256 * 1174 * fm.kv_bytes_per_token(spec)
    assert {k: v.peak for k, v in multi.phases.items() if k != "rollout"} == \
        {k: v.peak for k, v in single.phases.items() if k != "rollout"}
    assert any(n.startswith("multi-turn") for n in multi.notes) and not any(n.startswith("multi-turn")
                                                                          for n in single.notes)
    vllm = dict(kw, engine="vllm")
    assert build_plan(spec, multi_turn=True, **vllm).phases["rollout"].parts == \
        build_plan(spec, **vllm).phases["rollout"].parts  # vLLM: whole sequences in its KV cache already


def test_a_task_with_tools_is_planned_as_multi_turn():
    from tinyrl.config import load_config
    from tinyrl.memory.from_config import plan_for_config

    cfg = load_config("retool-4090", ["rollout.engine=hf", "actor.micro_batch_tokens=5120"])
    plan = plan_for_config(cfg, get_gpu("rtx4090"), simulate=False)
    assert "hf_turn_prefill_transient" in plan.phases["rollout"].parts
    cfg = load_config("math-grpo-4090", ["rollout.engine=hf"])
    assert "hf_turn_prefill_transient" not in plan_for_config(cfg, get_gpu("rtx4090"), simulate=False) \
        .phases["rollout"].parts


def test_a_cached_plan_is_keyed_by_the_code_it_traced_and_the_libraries(monkeypatch):
    """The cache key hashed the planner's three files only; the simulation traces the trainer's
    own passes (tinyrl/packing.py, models.py, ...) and torch's and transformers' code, so a plan
    cached before a change there was read as still true."""
    import importlib.metadata
    from pathlib import Path

    from tinyrl.config import load_config
    from tinyrl.memory.from_config import config_digest

    cfg, gpu = load_config("countdown-4090"), get_gpu("rtx4090")
    before = config_digest(cfg, gpu)
    assert config_digest(cfg, gpu) == before  # the same code and libraries: the same key
    read = Path.read_bytes
    with monkeypatch.context() as patch:  # packing.py as another tinyrl version would have it
        patch.setattr(Path, "read_bytes", lambda self: read(self) + (b"\n# changed" if self.name == "packing.py" else b""))
        assert config_digest(cfg, gpu) != before
    version = importlib.metadata.version
    with monkeypatch.context() as patch:
        patch.setattr(importlib.metadata, "version", lambda lib: "9.9.9" if lib == "torch" else version(lib))
        assert config_digest(cfg, gpu) != before
    assert config_digest(cfg, gpu) == before


SMALL_STEP = ["trainer.train_batch_size=4", "actor.ppo_mini_batch_size=2"]  # micro-batches of 4 rows at most


def test_a_padded_run_is_planned_and_probed_with_padded_passes(monkeypatch):
    """model.padding_free reaches every trace the plan makes, the real probes' step, and the
    cached plan's key (a plan for packed passes is not read back for a padded run)."""
    from tinyrl.config import load_config
    from tinyrl.memory import from_config as mp

    traced = []
    simulate_phase = sim.simulate_phase

    def spy(*args, **kwargs):
        traced.append(kwargs.get("padding_free", True))
        return simulate_phase(*args, **kwargs)

    monkeypatch.setattr(sim, "simulate_phase", spy)
    gpu = get_gpu("rtx4090")
    for setting in (False, True):
        traced.clear()
        cfg = load_config("countdown-tiny", [f"model.padding_free={str(setting).lower()}", *SMALL_STEP])
        mp.plan_for_config(cfg, gpu)
        assert traced and set(traced) == {setting}
        assert mp._step(cfg, "forward", "fp32").padding_free is setting
    padded, packed = (load_config("countdown-tiny", [f"model.padding_free={s}", *SMALL_STEP]) for s in ("false", "true"))
    assert mp.plan_path(padded, gpu) != mp.plan_path(packed, gpu)
