"""Which fused attention kernels a CUDA run may use: cuDNN's is switched off where its backward is
known to return NaN for the inputs tinyrl gives it.

Why (issue 20, item 3: bf16 on an H100 skipped 8 of 80 actor steps with "gradient norm is not
finite"; fp32 and the CPU skipped none). torch 2.11-2.13 pick cuDNN's fused attention by default
for bf16/fp16 on Hopper. Its backward returns NaN in dQ when all three hold
(pytorch/pytorch#196678, fixed by the cuDNN 9.26 upgrade, pytorch/pytorch#196861):
  1. an explicit attention mask is passed: transformers passes one whenever a batch has padding
     (transformers 5.19 masking_utils.sdpa_mask returns None, i.e. is_causal, only without it);
  2. the sequence length % 128 == 64: the kernel scores the padded half of its last 128-wide key
     tile as 0 instead of -inf;
  3. some query row's logsumexp is below ln(FLT_MAX) ~ -88.7: then exp(0 - lse) overflows fp32
     and inf * 0 (the zero-padded keys) is NaN. A left-padded prompt position attends to nothing,
     so its row's logsumexp is -inf: every tinyrl batch with prompts of different lengths has one.
countdown-tiny's prompts are 139-149 tokens, so a batch's longest is 148 and a step whose longest
response is 44 tokens is 192 = 128 + 64 wide: that step's every actor (and critic) optimizer step
had NaN gradients, 2 steps x 4 actor steps = the 8 of 80 seen. fp32 never reaches cuDNN attention
(half types only) and the CPU has none, which is why neither run skipped. Real Qwen2.5 models hit
condition 3 without padding too (huggingface/trl#7181: a "massive activation" head).

Without cuDNN, torch's dispatcher takes flash (no mask) or memory-efficient attention (a mask),
both clean on the same inputs per the issue above.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

FIXED_CUDNN = 92600  # cuDNN 9.26.0: the first release pytorch/pytorch#196861 trusts again


def cudnn_attention_is_safe(cudnn_version: int | None) -> bool:
    """cuDNN's fused attention backward is trusted only from 9.26 on (None: version unknown)."""
    return cudnn_version is not None and cudnn_version >= FIXED_CUDNN


def guard_attention_kernels(device: torch.device) -> None:
    """On CUDA with a cuDNN older than 9.26, switch cuDNN attention off for the whole process:
    a training step's forward, its backward, and gradient checkpointing's recomputation (which runs
    outside any context manager placed around the forward) all dispatch the same way then."""
    if device.type != "cuda":
        return
    version = torch.backends.cudnn.version()
    if cudnn_attention_is_safe(version) or not torch.backends.cuda.cudnn_sdp_enabled():
        return
    torch.backends.cuda.enable_cudnn_sdp(False)
    log.info("cuDNN %s: cuDNN attention switched off (its backward returns NaN for padded batches, "
             "pytorch/pytorch#196678); flash / memory-efficient attention are used instead", version)
