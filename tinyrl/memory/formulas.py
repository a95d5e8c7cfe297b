"""Closed-form byte counts: what is resident regardless of batch shape, and known per-token costs.

Used by the planner for everything that is not traced (the other model's weights, vLLM's
share, the CUDA context) and by tests to cross-check the simulation. Knows: Qwen2-style shapes
(tinyrl.model_specs), dtype sizes, Adam's state, bitsandbytes NF4 storage, vLLM's reservation
rule. Does not know: activations (simulate.py traces those) or allocator fragmentation.
"""

from __future__ import annotations

from tinyrl.errors import TinyRLError
from tinyrl.model_specs import embedding_param_count, head_dim, layer_param_count, linear_shapes

GiB = 1024**3
MiB = 1024**2

_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}

# The CUDA context + cuBLAS/cuDNN handles + kernels loaded by torch: 0.5-1 GiB on recent cards
# (seen ~0.6 GiB on Ada with torch 2.x; more once NCCL or Triton kernels load). Not the cuBLAS
# workspaces: those are the allocator's (CUBLAS_WORKSPACES_BYTES).
CUDA_CONTEXT_BYTES = int(0.75 * GiB)

# cuBLAS workspaces: torch takes them from its caching allocator (counted in memory_allocated)
# and keeps them for the life of the process. PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp
# (commit 26a39059ec580351411f180816c47e2ef5134ae1): setWorkspaceForHandle -> getNewWorkspace
# allocates parseChosenWorkspaceSize() per (cuBLAS handle, stream), 32 MiB on sm90 (H100/H200),
# 8 MiB + 128 KiB otherwise (a 4090, sm89); getCUDABlasLtWorkspace adds its own
# parseCUDABlasLtWorkspaceSize() (1 MiB; none where TORCH_CUBLASLT_UNIFIED_WORKSPACE shares
# cuBLAS's) per (handle, stream). tinyrl uses the default stream; handles come per thread, and
# autograd runs CUDA backward on its own device thread: 2 handles, the main thread's and the
# backward thread's. Sized for sm90 so one constant is safe on every card (a 4090 over-plans by ~48 MiB).
# On an H200 (torch 2.11) the 0.5B plan's forward and rollout were 50-80 MiB short without it.
CUBLAS_WORKSPACES_BYTES = 2 * (32 + 1) * MiB

# bitsandbytes NF4: 4-bit codes, one absmax per 64 weights; with double quantisation the
# absmax are themselves 8-bit with one fp32 scale per 256 of them (QLoRA's recipe).
NF4_BLOCK = 64
NF4_DOUBLE_QUANT_BLOCK = 256

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def dtype_bytes(dtype: str) -> int:
    try:
        return _DTYPE_BYTES[str(dtype).removeprefix("torch.")]
    except KeyError:
        raise TinyRLError(f"unknown dtype {dtype!r}", hint="use bf16, fp16 or fp32") from None


def nf4_bytes_per_param(double_quant: bool = True) -> float:
    """0.5 byte of code plus the absmax overhead (fp32 absmax: +0.0625; double quant: ~+0.0159)."""
    if double_quant:
        return 0.5 + 1 / NF4_BLOCK + 4 / (NF4_BLOCK * NF4_DOUBLE_QUANT_BLOCK)
    return 0.5 + 4 / NF4_BLOCK


def weight_bytes(spec: dict, dtype: str = "bf16", quantize: str | None = None) -> int:
    """Bytes of the model's weights. `quantize="nf4"`: the decoder linears in NF4; embeddings,
    lm_head, norms and biases stay in `dtype` (bitsandbytes/transformers skip them)."""
    b = dtype_bytes(dtype)
    layers = spec["num_hidden_layers"]
    other = embedding_param_count(spec) + spec["hidden_size"]
    if quantize is None:
        return (layers * layer_param_count(spec) + other) * b
    if quantize != "nf4":
        raise TinyRLError(f"unknown quantization {quantize!r}", hint="use nf4 or none")
    linear = sum(i * o for i, o in linear_shapes(spec).values())
    rest = layer_param_count(spec) - linear
    return int(layers * (linear * nf4_bytes_per_param() + rest * b) + other * b)


def lora_param_count(spec: dict, rank: int, targets: tuple[str, ...] | list[str] = ALL_LINEAR) -> int:
    """LoRA A (rank x in) + B (out x rank) per targeted linear, in every layer."""
    shapes = linear_shapes(spec)
    unknown = sorted(set(targets) - set(shapes))
    if unknown:
        raise TinyRLError(f"unknown LoRA target modules {unknown}", hint=f"choose from {sorted(shapes)}")
    per_layer = sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)
    return spec["num_hidden_layers"] * per_layer


def value_head_params(spec: dict) -> int:
    return spec["hidden_size"] + 1  # Linear(hidden, 1) with bias


def grad_bytes(n_params: int, dtype: str = "fp32") -> int:
    return n_params * dtype_bytes(dtype)


def adam_state_bytes(n_params: int, state_dtype: str = "fp32") -> int:
    """Adam's exp_avg and exp_avg_sq: 8 bytes/param in fp32 (torch keeps them in the param's
    dtype, so fp32 params or adapters give fp32 state)."""
    return 2 * n_params * dtype_bytes(state_dtype)


def master_weight_bytes(n_params: int) -> int:
    """An fp32 master copy for mixed-precision full fine-tuning: 4 bytes/param."""
    return 4 * n_params


def kv_bytes_per_token(spec: dict, dtype: str = "bf16") -> int:
    """K and V for every layer: 2 * layers * kv_heads * head_dim * bytes (Qwen2.5-0.5B: 12 KiB)."""
    return (2 * spec["num_hidden_layers"] * spec["num_key_value_heads"] * head_dim(spec)
            * dtype_bytes(dtype))


def vllm_reservation_bytes(gpu_memory_utilization: float, card_bytes: int) -> int:
    """vLLM takes gpu_memory_utilization x the card's TOTAL memory (not x what is free)."""
    return int(gpu_memory_utilization * card_bytes)


def logprob_chunk_bytes(chunk_tokens: int, vocab_size: int, logits_dtype: str = "bf16",
                        backward: bool = False) -> int:
    """Working set of one chunk of token log-probs (tinyrl.rl.logprobs: logits in the model
    dtype, their fp32 copy, log-prob = gather - logsumexp). Forward only: the larger of the
    cast (d + 4 bytes per logit) and logsumexp, whose kernel makes an fp32 temporary the size of
    its input beside the fp32 logits (4 + 4; simulate.HIDDEN_WORKSPACE): 8. With backward (the
    chunk is recomputed inside its checkpoint): the recomputed logits (d + 4), then fp32
    softmax, gather-scatter and summed gradients (3 x 4), cast back to d for the matmul: 2d + 16
    bytes per logit (bf16: 8 and 20, as traced and as torch's CPU allocator gave; entropy adds none)."""
    d = dtype_bytes(logits_dtype)
    return chunk_tokens * vocab_size * ((2 * d + 16) if backward else max(d + 4, 8))


def full_logits_bytes(tokens: int, vocab_size: int) -> int:
    """What chunking avoids: one fp32 [tokens, vocab] tensor (1,280 Qwen tokens: ~0.78 GB)."""
    return tokens * vocab_size * 4


# ------------------------------------------------------------ the HF engine's rollout (decode)

# merged_adapter (rollout/hf_engine.py) keeps at most 1/32 of a layer's elements as fixes
# (int64 index + original value); a layer that would need more is left unmerged.
MERGE_FIX_DENOMINATOR = 32

# Bytes per (row, vocab entry) alive at the sampling peak of one decode step
# (rollout/decode.py `sample_tokens`): the model's bf16 logits (2), fp32 scores (4), then
#   sampling: log-probs, softmax probs, the Exp(1) draws and probs / draws (4 x 4) -> 22;
#   top_p (transformers TopPLogitsWarper): sorted scores (4), sort indices (int64, 8), the
#   softmax and its cumsum (4 + 4) -> 26, the larger, before any log-prob exists.
SAMPLING_BYTES_PER_LOGIT = 22
TOP_P_BYTES_PER_LOGIT = 26


def merge_fix_bytes(spec: dict, targets: tuple[str, ...] | list[str] = ALL_LINEAR, dtype: str = "bf16") -> int:
    """The most `merged_adapter` holds beyond the weights: its fixes (index 8 + value bytes for
    1/MERGE_FIX_DENOMINATOR of every adapted element) plus one layer's transients while it
    merges (delta, W + delta, (W + delta) - delta in `dtype`, and a bool per element)."""
    b = dtype_bytes(dtype)
    sizes = [i * o for name, (i, o) in linear_shapes(spec).items() if name in targets]
    fixes = spec["num_hidden_layers"] * sum(sizes) // MERGE_FIX_DENOMINATOR * (8 + b)
    return fixes + max(sizes, default=0) * (3 * b + 1)


def kv_expansion_bytes(spec: dict, rows: int, keys: int, dtype: str = "bf16") -> int:
    """transformers' repeat_kv (5.20.2 integrations/sdpa_attention.py: whenever a mask is passed
    on CUDA) copies one layer's K and V to every query head: 2 x rows x heads x keys x head_dim
    (Qwen2.5-3B, 256 rows, 1,174 keys: 2,462,056,448 bytes)."""
    return 2 * rows * spec["num_attention_heads"] * keys * head_dim(spec) * dtype_bytes(dtype)


def sampling_bytes(rows: int, vocab_size: int, top_p: bool = True) -> int:
    """One decode step's sampling temporaries over [rows, vocab] (SAMPLING_BYTES_PER_LOGIT says
    which; Qwen2.5-3B, 256 rows, top_p: 1,011,286,016 bytes)."""
    return rows * vocab_size * (TOP_P_BYTES_PER_LOGIT if top_p else SAMPLING_BYTES_PER_LOGIT)


def hf_decode_transient_bytes(spec: dict, rows: int, keys: int, expands_kv: bool, top_p: bool = True) -> int:
    """The largest transient of a decode step beside the KV cache: the forward (the previous
    step's bf16 logits, plus the K/V expansion where the decode loop cannot avoid it) or the
    sampling, whichever is larger (they do not overlap: decode.py frees the step's fp32
    temporaries before the next forward)."""
    forward = 2 * rows * spec["vocab_size"] + (kv_expansion_bytes(spec, rows, keys) if expands_kv else 0)
    return max(forward, sampling_bytes(rows, spec["vocab_size"], top_p))
