"""Simulated vs measured step memory, and the two headline plans, with timings.

    python benchmarks/memory_sim_vs_real.py            # fresh trace cache (honest timings)
    python benchmarks/memory_sim_vs_real.py --cached   # reuse $TINYRL_CACHE

Measured = tinyrl's step run for real in bf16 on CPU: resident bytes + the CPU allocator's
peak from profiler events (tinyrl.memory.probe.real_phase_peak). Simulated = fake tensors,
1 and 2 layers traced, extrapolated (tinyrl.memory.simulate.simulate_phase).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import tinyrl  # noqa: F401  (before transformers/peft)
from tinyrl.hardware import GiB, get_gpu
from tinyrl.memory.plan import build_plan
from tinyrl.memory import simulate as sim
from tinyrl.memory.probe import (live_tensor_bytes, real_phase_peak, real_try_step,
                                 run_under_memory_limit, search_with_proof)
from tinyrl.memory.simulate import Step, simulate_phase
from tinyrl.model_specs import load_spec

MiB = 2**20
COMMON = dict(model_type="qwen2", max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0)
SIZES = {
    "tiny (h128, 2L, V768)": dict(COMMON, vocab_size=768, hidden_size=128, intermediate_size=384,
                                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  head_dim=64, tie_word_embeddings=True),
    "mid (h768, 4L, V32k)": dict(COMMON, vocab_size=32000, hidden_size=768, intermediate_size=2048,
                                 num_hidden_layers=4, num_attention_heads=12, num_key_value_heads=2,
                                 head_dim=64, tie_word_embeddings=False),
    "large (h1024, 6L, V32k)": dict(COMMON, vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                    num_hidden_layers=6, num_attention_heads=16, num_key_value_heads=4,
                                    head_dim=64, tie_word_embeddings=False),
}
STEPS = [Step("actor_update", 2, 512, 256, "lora", 16, logprob_chunk=256),
         Step("forward", 2, 512, 256, "lora", 16, logprob_chunk=256),
         Step("critic_update", 2, 512, 256, "full", logprob_chunk=256)]


def sim_vs_real() -> None:
    print(f"{'size':26} {'phase':14} {'ft':5} {'simulated':>10} {'measured':>10} {'ratio':>6} "
          f"{'sim s':>6} {'real s':>6}")
    for name, spec in SIZES.items():
        for step in STEPS:
            t0 = time.perf_counter()
            simulated = simulate_phase(spec, step.phase, step.micro_batch, step.seq_len,
                                       response_len=step.response_len, finetune=step.finetune,
                                       lora_rank=step.lora_rank, logprob_chunk=step.logprob_chunk)["peak"]
            t1 = time.perf_counter()
            real = real_phase_peak(spec, step)
            t2 = time.perf_counter()
            print(f"{name:26} {step.phase:14} {step.finetune:5} {simulated / MiB:9.1f}M {real / MiB:9.1f}M "
                  f"{simulated / real:6.3f} {t1 - t0:6.1f} {t2 - t1:6.1f}", flush=True)


def probe_vs_sim(headroom: int = 64 * MiB) -> None:
    """The real search under an address-space ceiling against the simulated answer for the
    same headroom in tensor bytes. Not a like-for-like measurement: RLIMIT_AS also counts
    MKL/oneDNN scratch, page rounding and allocator slack, so the real answer is smaller."""
    spec = dict(SIZES["tiny (h128, 2L, V768)"], vocab_size=8192)
    step = Step("actor_update", 1, 128, 64, "lora", 8, logprob_chunk=128, dtype="fp32")
    t0 = time.perf_counter()
    real = run_under_memory_limit(search_with_proof, headroom, spec, step, prepare=real_try_step)
    t1 = time.perf_counter()
    models = sim.build_models(spec, step, device="cpu")
    opts = sim.make_optimizers(models)
    sim.warm_start(models, opts, step.phase)
    resident = live_tensor_bytes(*sim.all_modules(models), *opts.values())
    simulated = sim.fit_max_micro_batch(spec, "actor_update", resident + headroom, 128,
                                        max_micro_batch=512, response_len=64, lora_rank=8,
                                        logprob_chunk=128, dtype="fp32")
    t2 = time.perf_counter()
    print(f"\nprobe under RLIMIT_AS, {headroom // MiB} MiB headroom: B = {real['max_micro_batch']} "
          f"(reruns: {real['reruns']}; 2B: {(real['double_error'] or 'ran')[:70]}...) in {t1 - t0:.1f} s;"
          f"\n  simulated B for {headroom // MiB} MiB of tensors: {simulated} ({t2 - t1:.1f} s)")


def headline(title: str, spec_name: str, **kw) -> None:
    t0 = time.perf_counter()
    plan = build_plan(load_spec(spec_name), model=spec_name, **kw)
    took = time.perf_counter() - t0
    print(f"\n{title}: fits={plan.fits}, planned in {took:.1f} s "
          f"(budget {plan.budget_bytes / GiB:.2f} GiB)")
    for phase, peak, micro, top in plan.rows():
        mb = f"micro-batch {micro:3d}" if micro else " " * 15
        print(f"  {phase:15} {peak:6.2f} GiB  {mb}  {top}")
    for note in plan.notes[2:]:
        print(f"  - {note}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cached", action="store_true", help="reuse the trace cache")
    ap.add_argument("--skip-real", action="store_true", help="headlines only")
    args = ap.parse_args()
    if not args.cached:
        os.environ["TINYRL_CACHE"] = tempfile.mkdtemp(prefix="tinyrl-bench-")
    if not args.skip_real:
        sim_vs_real()
        probe_vs_sim()
    gpu = get_gpu("rtx4090")
    headline("Qwen2.5-3B LoRA PPO + critic on rtx4090 (prompt 256 + response 1024, 256 prompts/step)",
             "Qwen/Qwen2.5-3B", gpu=gpu, prompt_len=256, response_len=1024, prompts_per_step=256,
             mini_batch_prompts=64, finetune="lora", lora_rank=64)
    headline("Qwen2.5-0.5B full PPO + critic on rtx4090, capped at 12 GiB (256 + 256, 32 prompts/step)",
             "Qwen/Qwen2.5-0.5B", gpu=gpu, prompt_len=256, response_len=256, prompts_per_step=32,
             mini_batch_prompts=16, finetune="full", budget_bytes=12 * GiB)
    headline("Qwen2.5-0.5B LoRA PPO + critic on rtx4090, capped at 12 GiB (256 + 256, 32 prompts/step)",
             "Qwen/Qwen2.5-0.5B", gpu=gpu, prompt_len=256, response_len=256, prompts_per_step=32,
             mini_batch_prompts=16, finetune="lora", lora_rank=32, budget_bytes=12 * GiB)


if __name__ == "__main__":
    main()
