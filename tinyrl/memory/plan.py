"""The memory plan: what each phase of a step holds on the card, and the sizes that fit.

Phases (tinyrl.phases.PLANNED_PHASES): rollout (vLLM awake: its weights + KV cache, beside the
trainer's resident weights and Adam state), forward (no-grad forwards: old and reference
log-probs, values), actor_update, critic_update (PPO with a critic only). vLLM
sleeps during the training phases. The training phases come from simulate.py (traced, per
micro-batch); the rest from formulas.py. Knows: budgets, vLLM's sizing rules. Does not know:
how the trainer runs (it reads the plan) or what the card really does (probe.py measures).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from tinyrl.errors import TinyRLError
from tinyrl.hardware import GPU
from tinyrl.memory import formulas as fm
from tinyrl.memory import simulate as sim
from tinyrl.model_specs import linear_shapes
from tinyrl.phases import Phase

GiB = fm.GiB

# vLLM's share beyond weights and KV cache, both approximate: CUDA graphs captured for decode
# batch sizes (vLLM counts them inside gpu_memory_utilization), and what stays on the card
# while it sleeps (graph pools, allocator slack; weights and KV cache are gone at level 1).
VLLM_CUDA_GRAPHS_BYTES = int(0.5 * GiB)
VLLM_ASLEEP_BYTES = int(0.5 * GiB)
VLLM_BLOCK_TOKENS = 16


@dataclass
class PhasePlan:
    peak: int
    parts: dict[str, int]           # bytes by category; they add up to peak
    micro_batch: int = 0            # sequences per micro-batch (training phases)
    token_budget: int = 0           # micro_batch * sequence length
    fits: bool = True


@dataclass
class MemoryPlan:
    model: str
    gpu: str
    card_bytes: int
    budget_bytes: int               # what every phase must stay under
    phases: dict[str, PhasePlan]
    vllm_gpu_memory_utilization: float
    vllm_max_num_seqs: int
    vllm_share: dict[str, int]      # inside the vLLM reservation: weights, activations, graphs, KV
    fits: bool
    simulated: bool                 # False: activations from a rule of thumb, not a trace
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "MemoryPlan":
        data = json.loads(text)
        data["phases"] = {k: PhasePlan(**v) for k, v in data["phases"].items()}
        return cls(**data)

    def rows(self) -> list[tuple[str, float, int, str]]:
        """(phase, peak GiB, micro-batch, the largest parts) for a table; the CLI prints."""
        out = []
        for name, ph in self.phases.items():
            top = sorted(ph.parts.items(), key=lambda kv: -kv[1])[:3]
            out.append((name, ph.peak / GiB, ph.micro_batch,
                        ", ".join(f"{k} {v / GiB:.2f}" for k, v in top)))
        return out


def build_plan(spec: dict, *, gpu: GPU, prompt_len: int, response_len: int, prompts_per_step: int,
               rollout_n: int = 1, mini_batch_prompts: int | None = None, critic: bool = True,
               reference: bool = True,
               finetune: str = "lora", lora_rank: int = 32,
               lora_targets: tuple[str, ...] = fm.ALL_LINEAR, quantize: str | None = None,
               gradient_checkpointing: bool = True, logprob_chunk: int = 1024,
               with_entropy: bool = True, margin_fraction: float = 0.10,
               budget_bytes: int | None = None, engine: str = "vllm",
               offload_optimizer_in_rollout: bool = False, vllm_max_batched_tokens: int = 8192,
               micro_batch: int | None = None, simulate: bool = True, model: str = "",
               multi_turn: bool = False, sft: bool = False, padding_free: bool = True) -> MemoryPlan:
    """Plan every phase against `budget_bytes` (default: the card less `margin_fraction`, which
    covers allocator fragmentation and what the trace does not see).

    Micro-batches (sequences) are the largest that fit, capped by the sequences per optimizer
    step (mini_batch_prompts x rollout_n) or per step for the no-grad phase; `micro_batch`
    fixes them instead. vLLM gets what is left after the trainer's resident memory.

    `multi_turn` (a task with tools): an episode's tokens after the prompt, tool turns included,
    are bounded by `response_len` (rollout.max_response_length), so every phase is already priced
    at prompt_len + response_len per episode; what the turns add is the hf engine's prefill of a
    tool turn on top of each episode's own kept cache (_hf_generate_parts).

    `sft` (`tinyrl sft`): the actor alone, no rollout engine, rows of prompt_len + response_len
    tokens with log-probs over response_len of them; the phases are its update and the no-grad
    forward of its validation loss, traced through the SFT trainer's own loss (simulate.Step.sft).

    `padding_free` (model.padding_free): the passes traced are the trainer's packed ones, or with
    False its padded ones (every pad computed, transformers' [rows, 1, width, width] mask)."""
    if quantize not in (None, "nf4") or (quantize == "nf4" and finetune != "lora"):
        raise TinyRLError(f"quantize={quantize!r} with finetune={finetune!r} cannot be planned",
                          hint="NF4 (QLoRA) quantises a frozen base: use it with finetune=lora")
    if quantize == "nf4" and engine == "vllm":  # config.problems_of refuses the same (vLLM has no bnb method)
        raise TinyRLError("an NF4 base with the vLLM rollout engine cannot be planned: vLLM cannot load a "
                          "bitsandbytes 4-bit base", hint="plan it with engine='hf', or quantize=None")
    seq = prompt_len + response_len
    budget = budget_bytes if budget_bytes is not None else int(gpu.memory_bytes * (1 - margin_fraction))
    per_step = prompts_per_step * rollout_n
    per_update = (mini_batch_prompts or prompts_per_step) * rollout_n
    common = {"response_len": response_len, "finetune": finetune, "lora_rank": lora_rank,
              "lora_targets": tuple(lora_targets), "gradient_checkpointing": gradient_checkpointing,
              "dtype": "bf16", "logprob_chunk": logprob_chunk, "with_entropy": with_entropy,
              "critic": critic, "reference": reference,  # the roles (tinyrl.roles): no critic, no critic parts
              "sft": sft, "padding_free": padding_free,
              # a prompt's rollout_n rows share it in a packed pass: priced at the worse layout
              "shared_by": rollout_n}
    if sft and (critic or reference or rollout_n != 1):
        raise TinyRLError("an SFT plan has the actor alone, one row per example",
                          hint="critic=False, reference=False, rollout_n=1")
    notes = [f"budget {budget / GiB:.2f} GiB of {gpu.memory_bytes / GiB:.2f} GiB on {gpu.name}",
             f"CUDA context {fm.CUDA_CONTEXT_BYTES / GiB:.2f} GiB in every phase (approximate)"]
    outside = {"cuda_context": fm.CUDA_CONTEXT_BYTES}  # on the card beside the trainer's tensors
    # The trainer's allocator holds these from its first matmul on: allocated bytes (not
    # versus.OUTSIDE_PARTS), and off the budget the micro-batch search gets.
    workspaces = {"cublas_workspaces": fm.CUBLAS_WORKSPACES_BYTES}
    notes.append(f"cuBLAS workspaces {fm.CUBLAS_WORKSPACES_BYTES / fm.MiB:.0f} MiB in every phase "
                 "(the main and backward threads', sized for H100/H200)")
    if engine == "vllm" and not sft:
        outside["vllm_asleep"] = VLLM_ASLEEP_BYTES
        notes.append(f"vLLM asleep (level 1) keeps ~{VLLM_ASLEEP_BYTES / GiB:.2f} GiB during training")
    # The trace holds a bf16 base: with NF4 the searched budget grows by what NF4 saves.
    nf4_saving = _nf4_saving(spec) if quantize == "nf4" else 0

    phases: dict[str, PhasePlan] = {}
    caps = {Phase.FORWARD: per_step, Phase.ACTOR_UPDATE: per_update, Phase.CRITIC_UPDATE: per_update}
    for phase in [Phase.FORWARD, Phase.ACTOR_UPDATE] + ([Phase.CRITIC_UPDATE] if critic else []):
        trainer_budget = budget - sum(outside.values()) - sum(workspaces.values()) + nf4_saving
        if micro_batch is not None:
            b = micro_batch
        elif simulate:
            b = sim.fit_max_micro_batch(spec, str(phase), trainer_budget, seq,
                                        max_micro_batch=caps[phase], **common)
        else:
            b = _rough_max_micro_batch(spec, phase, trainer_budget, seq, caps[phase], common)
        parts = {**_trainer_parts(spec, phase, max(b, 1), seq, common, simulate, quantize), **workspaces, **outside}
        peak = sum(parts.values())
        phases[str(phase)] = PhasePlan(peak, parts, b, b * seq, fits=b >= 1 and peak <= budget)

    if sft:
        notes.append(f"SFT: the actor alone, no rollout engine; every row priced at {seq} tokens, "
                     f"log-probs over {response_len} of them; forward = the validation loss (no grad)")
        return MemoryPlan(model, gpu.name, gpu.memory_bytes, budget, phases, 0.0, 0, {},
                          all(p.fits for p in phases.values()), simulate, notes)
    rollout, util, max_seqs, share, rollout_notes = _rollout(
        spec, gpu, budget, seq, per_step, engine, quantize, vllm_max_batched_tokens,
        _trainer_parts(spec, Phase.FORWARD, 1, seq, common, simulate, quantize),
        offload_optimizer_in_rollout, (prompts_per_step, prompt_len, common, multi_turn))
    phases = {Phase.ROLLOUT: rollout, **phases}
    notes += rollout_notes
    if multi_turn:
        prefill = rollout.parts.get("hf_turn_prefill_transient")
        notes.append(f"multi-turn: each episode (assistant and tool turns) is priced at its limit, "
                     f"{prompt_len} + {response_len} tokens"
                     + (f"; the HF engine keeps each episode's KV cache across turns, and a tool turn's "
                        f"prefill on top of it copies K/V for "
                        f"{prefill / GiB:.2f} GiB (rollout activations)" if prefill else "")
                     + "; the tool's processes use host RAM, not the card")
    if quantize == "nf4":
        notes.append("NF4 base: weights from the formula; activations traced for a bf16 base plus "
                     "one dequantised linear. Rollouts sample from that NF4 base with the hf engine "
                     "(vLLM has no bitsandbytes method, so nf4 runs never use it)")
    if not simulate:
        notes.append("not simulated: activations from a rule of thumb; rerun with simulation")
    return MemoryPlan(model, gpu.name, gpu.memory_bytes, budget, phases, util, max_seqs, share,
                      all(p.fits for p in phases.values()), simulate, notes)


def _rollout(spec, gpu, budget, seq, per_step, engine, quantize, batched_tokens, trainer,
             offload_optimizer, hf_shape) -> tuple[PhasePlan, float, int, dict[str, int], list[str]]:
    """The trainer's resident state (weights, Adam state unless offloaded; no grads, no
    activations) beside the rollout engine, which gets what is left."""
    parts = {"trainer_weights": trainer["base_weights"] + trainer["adapters"],
             "trainer_optimizer": 0 if offload_optimizer else trainer["optimizer"],
             "cublas_workspaces": fm.CUBLAS_WORKSPACES_BYTES,  # held since the last step's passes
             "cuda_context": fm.CUDA_CONTEXT_BYTES}
    notes = ["the trainer's Adam state is offloaded to CPU during rollout"] if offload_optimizer else []
    util, max_seqs, share = 0.0, per_step, {}
    if engine == "vllm":
        util, max_seqs, share = _size_vllm(spec, gpu, budget - sum(parts.values()), seq, per_step,
                                           quantize, batched_tokens)
        parts["vllm_reserved"] = fm.vllm_reservation_bytes(util, gpu.memory_bytes)
        notes += [f"vLLM: gpu_memory_utilization {util:.2f}, max_num_seqs {max_seqs} "
                  f"(of {per_step} sequences per step)",
                  "vLLM share: " + ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in share.items())]
    else:
        parts.update(_hf_generate_parts(spec, per_step, seq, *hf_shape))
    peak = sum(parts.values())
    return PhasePlan(peak, parts, fits=max_seqs >= 1 and peak <= budget), util, max_seqs, share, notes


def _nf4_saving(spec: dict) -> int:
    biggest = max(i * o for i, o in linear_shapes(spec).values())
    return fm.weight_bytes(spec) - fm.weight_bytes(spec, "bf16", "nf4") - 2 * biggest


def _trainer_parts(spec: dict, phase: str, b: int, seq: int, common: dict, simulate: bool,
                   quantize: str | None) -> dict[str, int]:
    if simulate:
        parts = sim.simulate_phase(spec, str(phase), b, seq, **common)
    else:
        parts = _rough_parts(spec, phase, b, seq, common)
    parts = {k: v for k, v in parts.items() if k not in ("peak", "logprob_chunk")}
    if quantize == "nf4":
        biggest = max(i * o for i, o in linear_shapes(spec).values())
        parts["base_weights"] = fm.weight_bytes(spec, "bf16", "nf4")
        parts["activations"] += biggest * 2  # one layer's weight dequantised to bf16 at a time
    return parts


def _size_vllm(spec: dict, gpu: GPU, free: int, seq: int, wanted: int, quantize: str | None,
               batched_tokens: int) -> tuple[float, int, dict[str, int]]:
    """gpu_memory_utilization and max_num_seqs: the KV cache must hold max_num_seqs whole
    sequences (so none is preempted), max_num_seqs = min(sequences per step, what fits)."""
    tokens_per_seq = math.ceil(seq / VLLM_BLOCK_TOKENS) * VLLM_BLOCK_TOKENS
    kv_seq = fm.kv_bytes_per_token(spec) * tokens_per_seq
    weights = fm.weight_bytes(spec, "bf16", quantize)
    # vLLM takes a whole-percent share of the card: the largest one that fits what is free.
    share = math.floor(100 * free / gpu.memory_bytes) / 100 * gpu.memory_bytes
    seqs = wanted
    for _ in range(3):  # the sampler's logits grow with max_num_seqs: settle in a few rounds
        act = _vllm_profile_bytes(spec, batched_tokens, max(seqs, 1))
        seqs = int(max(0, min(wanted, (share - weights - act - VLLM_CUDA_GRAPHS_BYTES) // kv_seq)))
    act = _vllm_profile_bytes(spec, batched_tokens, max(seqs, 1))
    parts = {"weights": weights, "activations": act, "cuda_graphs": VLLM_CUDA_GRAPHS_BYTES,
             "kv_cache": seqs * kv_seq}
    util = math.ceil(100 * sum(parts.values()) / gpu.memory_bytes) / 100
    return util, seqs, parts


def _vllm_profile_bytes(spec: dict, tokens: int, seqs: int) -> int:
    """vLLM's profiling forward (approximate): one layer's bf16 activations for a full batch of
    prefill tokens, plus the sampler's fp32 logits and probabilities for every sequence."""
    h, i = spec["hidden_size"], spec["intermediate_size"]
    q = spec["num_attention_heads"] * (spec.get("head_dim") or h // spec["num_attention_heads"])
    layer = tokens * (4 * h + 2 * q + 3 * i) * 2
    return layer + seqs * spec["vocab_size"] * 4 * 2


def _hf_generate_parts(spec: dict, seqs: int, seq: int, prompts: int, prompt_len: int, common: dict,
                       multi_turn: bool = False) -> dict[str, int]:
    """tinyrl's decode loop (rollout/decode.py) keeps a KV cache for the whole batch; beside it
    the largest transient: the prefill's K/V copied to every query head (transformers' repeat_kv
    with a padding mask, one layer at a time), or a decode step's (its sampling temporaries,
    plus the same copy where the loop cannot avoid it: sliding-window layers keep transformers'
    own masks). With LoRA, merged_adapter's exact-restore fixes (the most it may keep).
    Multi-turn: the engine keeps each episode's KV cache across turns (kept_cache.KeptCacheSession:
    during the tool calls the card holds each going-on episode's own context, no padding, within
    hf_kv_cache) and a later turn prefills only the added tokens (stop token + tool turn) on top
    of it; that prefill attends to the whole kept context with a mask, so transformers' sdpa
    copies K/V to every query head over every episode and up to the whole sequence: the same
    copy as re-prefilling the conversation (the copy is of the keys), no longer shared by a
    prompt's n samples. What keeping the cache saves is compute (prefill tokens), not this peak."""
    decode = fm.hf_decode_transient_bytes(spec, seqs, seq, expands_kv=bool(spec.get("use_sliding_window")))
    transients = {"hf_decode_transient": max(decode, fm.kv_expansion_bytes(spec, prompts, prompt_len))}
    if multi_turn:
        transients["hf_turn_prefill_transient"] = fm.kv_expansion_bytes(spec, seqs, seq)
    largest = max(transients, key=transients.get)  # they never overlap: the largest is the peak
    parts = {"hf_kv_cache": seqs * seq * fm.kv_bytes_per_token(spec), largest: transients[largest]}
    if common["finetune"] == "lora":
        parts["hf_merge_fixes"] = fm.merge_fix_bytes(spec, common["lora_targets"])
    return parts


# ------------------------------------------------------------------------------- rough rule

def _rough_parts(spec: dict, phase: str, b: int, seq: int, common: dict) -> dict[str, int]:
    """Without tracing: weights/adapters/Adam from the formulas; activations by a rule of thumb
    (per token: one saved hidden state per layer with checkpointing, or ~(16 h + 12 i) bytes
    per layer without, plus one layer's recompute and one log-prob chunk)."""
    h, i, layers = spec["hidden_size"], spec["intermediate_size"], spec["num_hidden_layers"]
    tokens = b * seq
    trained = 1 + common["critic"]  # models (or adapters) trained: the actor, and the critic if any
    if common["finetune"] == "lora":
        trainable = trained * fm.lora_param_count(spec, common["lora_rank"], common["lora_targets"]) \
            + (fm.value_head_params(spec) if common["critic"] else 0)
        base, adapters, opt = fm.weight_bytes(spec), 4 * trainable, fm.adam_state_bytes(trainable)
        grads = 4 * trainable // trained
    else:
        base = fm.weight_bytes(spec) if common["reference"] else 0  # the reference copy
        adapters = trained * fm.weight_bytes(spec)
        opt, grads = 2 * adapters, fm.weight_bytes(spec)
    training = phase != Phase.FORWARD
    per_layer = h * 2 if common["gradient_checkpointing"] else (16 * h + 12 * i) * 2
    act = tokens * (layers * per_layer + 12 * i * 2) if training else tokens * 12 * i * 2
    chunk = fm.logprob_chunk_bytes(min(common["logprob_chunk"], b * common["response_len"]),
                                   spec["vocab_size"], backward=training)
    return {"base_weights": base, "adapters": adapters, "gradients": grads if training else 0,
            "optimizer": opt, "activations": act + (chunk if phase != Phase.CRITIC_UPDATE else 0)}


def _rough_max_micro_batch(spec, phase, budget, seq, cap, common) -> int:
    best = 0
    for b in range(1, cap + 1):
        if sum(_rough_parts(spec, phase, b, seq, common).values()) > budget:
            break
        best = b
    return best
