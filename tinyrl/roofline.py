"""A roofline model of one RL step's seconds on one GPU: a first guess before any run exists.

Knows: a model's shape (parameters, KV bytes per token), a card's spec-sheet numbers (memory,
bandwidth, dense bf16 TFLOPS) and the shape of the work (prompts, samples, lengths, which passes).
Does not know: kernels, Python or scheduler overhead, padding, real response lengths. It is a
floor-ish estimate with every constant stated in `Assumptions`; a run's own metrics (`--from-run`)
always beat it.

The model, phase by phase (N = prompts x rollout.n samples, P = prompt tokens, R = response
tokens, M = "matmul params": every weight a token is multiplied by, lm_head included, the
embedding lookup not):

- rollout, prefill: compute-bound, 2 FLOPs/param/token: 2 * M * N * P / (TFLOPS * prefill_mfu).
- rollout, decode: one decode step reads the weights once plus the KV cache of every running
  sequence (bandwidth-bound), or does 2 * M * concurrency FLOPs, whichever is slower (the roof).
  Concurrency = min(N, max_num_seqs, sequences whose full P+R KV fits in vLLM's share of the card
  after weights and a fixed non-KV reserve). Continuous batching keeps the running batch full, so
  decode steps = R * N / concurrency, each with the average context P + R/2 in the cache.
- old and reference log-probs: one forward each over N * (P+R) tokens, 2 * M FLOPs/token.
- values (critic only): one forward of the critic, whose matmul params are M minus lm_head
  (a scalar value head replaces it; its H params are ignored).
- actor update, per ppo epoch: forward + backward. Full fine-tuning: 6 FLOPs/param/token
  (2 forward, 2 activation grads, 2 weight grads), 8 with gradient checkpointing (one more
  forward). LoRA: the frozen base still passes activation grads back, but computes no weight
  grads: 4, or 6 with checkpointing. Adapter FLOPs are ignored (~4% of the base at rank 64).
- critic update (critic only): the same factors over the critic's matmul params.
- training-side passes (log-probs, values, updates) run at train_mfu.
- plus a fixed per-step overhead: vLLM sleep/wake, weight or adapter sync, reward scoring,
  bookkeeping.
- a task with tools (multi-turn): R bounds every token of an episode after the prompt, tool turns
  included, and all of them are priced as decoded (tool output is really prefilled: cheaper, so
  still an upper bound); each episode makes its `tool_calls` calls, `tool_workers` at a time,
  `tool_call_s` each, added to the rollout as if no decoding overlapped them (an upper bound).

Also ignored (each a few % at <= 1,280 tokens): attention-score FLOPs, the optimizer step,
the value head, LoRA's extra kernels in vLLM.

An SFT step (`tinyrl sft`, estimate_sft_step) is the actor update alone, over rows x T tokens
(T = sft.max_length x sft_fill): the weights' update_flops_per_token as above, plus the attention
scores, which at SFT's lengths (ReTool: 16,384) are no longer a few %: a causal forward computes
QK^T and PV over T/2 earlier positions on average, 4 x layers x heads x head_dim x T/2 FLOPs per
token; the backward 2.5x that (FlashAttention-2 counts its 5 matmuls to the forward's 2 so), and
gradient checkpointing one more forward. Then a fixed sft_step_overhead_s (optimizer step, logs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinyrl.phases import Phase

GiB = 1024**3


@dataclass(frozen=True)
class Assumptions:
    """Every constant of the model. None of them is measured here: change them when a run says
    otherwise (all figures are fractions of the card's spec-sheet numbers)."""

    train_mfu: float = 0.35          # trainer passes (HF model, micro-batches): a common good MFU
    prefill_mfu: float = 0.5         # vLLM prefill: large fused matmuls
    decode_mfu: float = 0.5          # compute roof of a decode step at high concurrency
    bandwidth_efficiency: float = 0.8  # decode kernels reach ~70-85% of spec-sheet bandwidth
    vllm_memory_share: float = 0.5   # of the card, when rollout.vllm.gpu_memory_utilization = 0
    vllm_non_kv_bytes: int = 1 * GiB  # inside vLLM's share: activations, CUDA graphs, sampler
    max_num_seqs: int = 256          # vLLM's default, when rollout.vllm.max_num_seqs = 0
    step_overhead_s: float = 1.5     # sleep/wake + sync + reward + bookkeeping, a guess
    response_fill: float = 1.0       # mean response length / max: 1.0 is an upper bound
    # one call of a short program in tinyrl's sandbox (fresh interpreter): 0.41-0.53 s measured on
    # this project's busy 2-core machine (README, "The Python sandbox"); 0.85 s when it imports numpy
    tool_call_s: float = 0.5
    prompt_fill: float = 1.0         # mean prompt length / max: 1.0 (padded, as verl does)
    sft_fill: float = 1.0            # SFT: mean row length / sft.max_length: 1.0 is an upper bound
    sft_step_overhead_s: float = 0.3  # SFT: optimizer step + bookkeeping, no engine (a guess)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ModelShape:
    matmul_params: float        # M: params a token is multiplied by (lm_head in, embedding lookup out)
    head_params: float          # lm_head: vocab x hidden (tied or not, the matmul happens)
    weight_bytes: float         # bytes vLLM reads per decode step for the weights
    kv_bytes_per_token: float   # 2 (K and V) x layers x kv_heads x head_dim x dtype bytes
    attention_width: float = 0.0  # layers x heads x head_dim: QK^T and PV multiply-adds per position pair

    @classmethod
    def from_spec(cls, spec: dict, params: int, dtype_bytes: float = 2.0,
                  weight_bytes_per_param: float | None = None) -> "ModelShape":
        """From an HF config dict and its total parameter count (embedding counted once)."""
        hidden = spec["hidden_size"]
        head_dim = spec.get("head_dim") or hidden // spec["num_attention_heads"]
        kv_heads = spec.get("num_key_value_heads") or spec["num_attention_heads"]
        head = spec["vocab_size"] * hidden
        # Untied: the input embedding is a separate table that only gets looked up, not multiplied.
        matmul = params if spec.get("tie_word_embeddings", False) else params - head
        per_param = dtype_bytes if weight_bytes_per_param is None else weight_bytes_per_param
        return cls(
            matmul_params=float(matmul),
            head_params=float(head),
            weight_bytes=matmul * per_param,
            kv_bytes_per_token=2.0 * spec["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes,
            attention_width=float(spec["num_hidden_layers"] * spec["num_attention_heads"] * head_dim),
        )


@dataclass(frozen=True)
class Card:
    memory_bytes: float
    bandwidth_bytes_per_s: float
    flops_per_s: float          # dense bf16 tensor FLOP/s (TFLOPS x 1e12)


@dataclass(frozen=True)
class Workload:
    prompts: int                # per step (trainer.train_batch_size)
    n: int                      # samples per prompt
    prompt_tokens: int          # max prompt length
    response_tokens: int        # max response length
    lora: bool
    checkpointing: bool
    critic: bool                # PPO with a value model (GAE); GRPO-like estimators have none
    ppo_epochs: int = 1
    vllm_memory_share: float = 0.0  # 0: Assumptions.vllm_memory_share
    max_num_seqs: int = 0           # 0: Assumptions.max_num_seqs
    tool_calls: int = 0             # per episode, at most (a task with tools: rollout.max_tool_calls)
    tool_workers: int = 1           # calls running at once (rollout.tool_workers, resolved)


@dataclass(frozen=True)
class Roofline:
    phases: dict[str, float]    # seconds: rollout, forward, actor_update, [critic_update], overhead (tinyrl.phases)
    details: dict[str, float | str]  # prefill_s, decode_s, decode_concurrency, decode_bound, ...

    @property
    def sec_per_step(self) -> float:
        return sum(self.phases.values())


class DoesNotFit(ValueError):
    """vLLM's share cannot hold the weights plus one sequence's KV cache."""


def update_flops_per_token(lora: bool, checkpointing: bool) -> float:
    """FLOPs per matmul param per token of one forward + backward (see the module docstring)."""
    backward = 2.0 if lora else 4.0     # activation grads (+ weight grads when not frozen)
    return 2.0 + backward + (2.0 if checkpointing else 0.0)


# Attention-score FLOPs of one training pass, as multiples of the forward's: the forward, the
# backward (FlashAttention-2, Dao 2023, counts it as 2.5x the forward: 5 matmuls to 2), and with
# gradient checkpointing the forward again.
ATTENTION_BACKWARD = 2.5


def sft_attention_flops_per_token(shape: ModelShape, tokens: float, checkpointing: bool) -> float:
    """Attention-score FLOPs per token of one SFT update over rows of `tokens` tokens (causal:
    T/2 earlier positions on average; QK^T and PV, 2 FLOPs per multiply-add each)."""
    forward = 4.0 * shape.attention_width * tokens / 2
    return forward * (1.0 + ATTENTION_BACKWARD + (1.0 if checkpointing else 0.0))


def estimate_sft_step(shape: ModelShape, card: Card, rows: int, max_tokens: int, lora: bool,
                      checkpointing: bool, a: Assumptions = Assumptions()) -> Roofline:
    """One `tinyrl sft` step: forward + backward of the actor over `rows` rows of up to
    `max_tokens` tokens (sft.max_length), at train_mfu; see the module docstring."""
    tokens = max_tokens * a.sft_fill
    update = update_flops_per_token(lora, checkpointing)
    attention = sft_attention_flops_per_token(shape, tokens, checkpointing)
    rate = card.flops_per_s * a.train_mfu
    weights_s = update * shape.matmul_params * rows * tokens / rate
    attention_s = attention * rows * tokens / rate
    return Roofline(phases={Phase.ACTOR_UPDATE: weights_s + attention_s, "overhead": a.sft_step_overhead_s},
                    details={"train_tokens_per_step": rows * tokens, "update_flops_per_param_token": update,
                             "attention_s": attention_s, "weights_s": weights_s})


def decode_concurrency(shape: ModelShape, card: Card, work: Workload, a: Assumptions) -> int:
    share = work.vllm_memory_share or a.vllm_memory_share
    cap = work.max_num_seqs or a.max_num_seqs
    kv_budget = card.memory_bytes * share - shape.weight_bytes - a.vllm_non_kv_bytes
    per_seq = shape.kv_bytes_per_token * (work.prompt_tokens + work.response_tokens)
    fits = int(kv_budget // per_seq) if kv_budget > 0 else 0
    if fits < 1:
        raise DoesNotFit(
            f"vLLM's share ({share:.0%} of {card.memory_bytes / GiB:.1f} GiB) leaves "
            f"{max(kv_budget, 0) / GiB:.2f} GiB for the KV cache after {shape.weight_bytes / GiB:.2f} GiB "
            f"of weights; one {work.prompt_tokens + work.response_tokens}-token sequence needs "
            f"{per_seq / GiB:.3f} GiB"
        )
    return min(work.prompts * work.n, cap, fits)


def estimate_step(shape: ModelShape, card: Card, work: Workload, a: Assumptions = Assumptions()) -> Roofline:
    seqs = work.prompts * work.n
    prompt = work.prompt_tokens * a.prompt_fill
    response = work.response_tokens * a.response_fill
    bandwidth = card.bandwidth_bytes_per_s * a.bandwidth_efficiency

    prefill = 2 * shape.matmul_params * seqs * prompt / (card.flops_per_s * a.prefill_mfu)
    conc = decode_concurrency(shape, card, work, a)
    step_bytes = shape.weight_bytes + conc * (prompt + response / 2) * shape.kv_bytes_per_token
    step_s = max(step_bytes / bandwidth, 2 * shape.matmul_params * conc / (card.flops_per_s * a.decode_mfu))
    decode_steps = response * seqs / conc
    decode = decode_steps * step_s

    tokens = seqs * (prompt + response)
    train_rate = card.flops_per_s * a.train_mfu
    critic_params = shape.matmul_params - shape.head_params
    forward = 2 * shape.matmul_params * tokens / train_rate
    update = update_flops_per_token(work.lora, work.checkpointing)
    # FORWARD: old and reference log-probs, and the critic's values when there is one
    # (no critic, as in GRPO and friends: no value pass at all).
    phases = {Phase.ROLLOUT: prefill + decode,
              Phase.FORWARD: 2 * forward + (2 * critic_params * tokens / train_rate if work.critic else 0.0)}
    phases[Phase.ACTOR_UPDATE] = work.ppo_epochs * update * shape.matmul_params * tokens / train_rate
    if work.critic:
        phases[Phase.CRITIC_UPDATE] = work.ppo_epochs * update * critic_params * tokens / train_rate
    tools = seqs * work.tool_calls * a.tool_call_s / max(work.tool_workers, 1)
    phases[Phase.ROLLOUT] += tools
    phases["overhead"] = a.step_overhead_s
    details = {
        "prefill_s": prefill,
        "decode_s": decode,
        "decode_concurrency": float(conc),
        "decode_steps": decode_steps,
        "decode_step_ms": step_s * 1e3,
        "decode_bound": "bandwidth" if step_bytes / bandwidth >= step_s else "compute",
        "train_tokens_per_step": tokens,
        "update_flops_per_param_token": update,
        "tools_s": tools,
    }
    return Roofline(phases=phases, details=details)
