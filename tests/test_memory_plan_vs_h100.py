"""The simulated plan against what one NVIDIA H100 measured (issue 20, 2026-11-23, main at
e4b601d, torch 2.11.0+cu130, transformers 5.17.0, peft 0.21.0; random-weight Qwen2.5 built from
tinyrl/model_specs). Budget: the 4090 preset's 21.59 GiB, less the CUDA context and vLLM asleep
(plan.py), exactly what the real probe capped the allocator at.

What is asserted is what this branch models and explains (see the report of wt-gpu):
- the no-grad forward of the 3B preset: measured 47 sequences; before the 2-and-3-layer
  extrapolation the simulation said 32 (a phantom hidden state per layer);
- the 0.5B full fine-tune run at the simulated settings (9 x 512 tokens) reached 14.42 GiB
  allocated: the trainer's AdamW keeps fp32 moments for bf16 weights (+3.68 GiB over torch's
  AdamW, which the old simulation used), so the traced tensors must come to that figure.
- the 3B actor/critic update: measured 19 sequences (20 did not fit); the traced tensors alone
  allowed 21, two allocator blocks of the largest transient size (simulate.HEADROOM_BLOCKS,
  calibrated on this very measurement) make it 19. The plan must never promise more than the card
  held, and not waste more than 15% of it.
- the 0.5B full fine-tune's "3 sequences" of issue 20 were measured with torch's AdamW (bf16
  moments); the trainer's AdamW keeps fp32 moments, whose 7.4 GiB leave nothing of a 12 GiB budget
  (the preset plans into 18 GiB): not comparable any more, so its tensors are checked instead.
"""

import pytest

import tinyrl  # noqa: F401  (before transformers/peft)
from tinyrl.memory import formulas as fm
from tinyrl.memory import simulate as sim
from tinyrl.memory.plan import VLLM_ASLEEP_BYTES
from tinyrl.model_specs import load_spec

GiB = 2**30
# what build_plan leaves the trainer's tensors: the budget less what else is on the card
TRAINER_BUDGET_3B = int(21.59 * GiB) - fm.CUDA_CONTEXT_BYTES - VLLM_ASLEEP_BYTES - fm.CUBLAS_WORKSPACES_BYTES
LORA_3B = dict(response_len=1024, finetune="lora", lora_rank=64, logprob_chunk=1024)


def test_3b_forward_fits_what_the_h100_held_and_no_more():
    spec = load_spec("Qwen/Qwen2.5-3B")
    peak = {b: sim.simulate_phase(spec, "forward", b, 1280, **LORA_3B)["peak"] for b in (40, 47, 48)}
    assert peak[47] <= TRAINER_BUDGET_3B           # measured: 47 ran
    assert peak[48] > TRAINER_BUDGET_3B            # measured: 48 did not


def test_05b_full_actor_update_tensors_match_the_h100_run():
    spec = load_spec("Qwen/Qwen2.5-0.5B")
    parts = sim.simulate_phase(spec, "actor_update", 9, 512, response_len=256, finetune="full",
                               logprob_chunk=1024)
    tensors = parts["peak"] - parts["allocator"]   # torch.cuda.max_memory_allocated counts tensors
    assert tensors == pytest.approx(14.42 * GiB, rel=0.03)


@pytest.mark.parametrize("phase", ["actor_update", "critic_update"])
def test_3b_update_plans_no_more_than_the_h100_held_and_within_15_percent(phase):
    spec = load_spec("Qwen/Qwen2.5-3B")
    planned = sim.fit_max_micro_batch(spec, phase, TRAINER_BUDGET_3B, 1280, max_micro_batch=64, **LORA_3B)
    measured = 19
    assert planned <= measured
    assert planned >= 0.85 * measured
