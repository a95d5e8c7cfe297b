"""Issue 20, item 3: bf16 on CUDA skipped optimizer steps because cuDNN's fused attention backward
returns NaN for padded batches whose width % 128 == 64 (tinyrl/attention.py has the mechanism
and the sources). The cause cannot run here (no cuDNN on a CPU build); what can be checked is that
every model tinyrl builds for a CUDA device switches that kernel off before it is used, and that
the batches tinyrl makes do meet the bug's preconditions (so the guard is not decoration)."""

from __future__ import annotations

import pytest
import torch

from tinyrl.attention import cudnn_attention_is_safe, guard_attention_kernels
from tinyrl.config import ModelConfig
from tinyrl.models import PolicyModels, make_batch


@pytest.fixture
def cudnn_attention_on(monkeypatch):
    """cuDNN attention enabled as torch ships it, and a cuDNN version of the affected range
    (torch 2.11+cu130 shipped 9.1x/9.2x); the process flag is put back afterwards."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 92000)
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_only_cudnn_9_26_on_is_trusted():
    assert not cudnn_attention_is_safe(None)
    assert not cudnn_attention_is_safe(92000)   # torch 2.13's wheels (nvidia-cudnn-cu13 9.20)
    assert not cudnn_attention_is_safe(92501)
    assert cudnn_attention_is_safe(92600)


def test_policy_models_on_cuda_switch_cudnn_attention_off(cudnn_attention_on, tiny_fp32_model):
    cfg = ModelConfig(finetune="lora", gradient_checkpointing=False)
    try:
        PolicyModels.from_modules(cfg, tiny_fp32_model, torch.device("cuda"))
    except (AssertionError, RuntimeError):
        pass  # a CPU build cannot move the value head to "cuda"; the guard runs before that
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_cpu_and_fixed_cudnn_leave_the_kernels_alone(cudnn_attention_on, monkeypatch):
    guard_attention_kernels(torch.device("cpu"))
    assert torch.backends.cuda.cudnn_sdp_enabled()
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 92600)
    guard_attention_kernels(torch.device("cuda"))
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_tinyrl_batches_meet_the_kernel_bugs_preconditions(tiny_fp32_model):
    """Prompts of different lengths give (1) an explicit mask from transformers and (3) a query
    row that attends to nothing, whose logsumexp is -inf (below the bug's ~-88.7). Checked on
    the SDPA inputs of the tiny model's first layer, recorded through the real forward."""
    from transformers.masking_utils import create_causal_mask

    batch = make_batch([[5, 6, 7], [5, 6, 7, 8, 9]], [[10, 11], [12]], pad_id=0)
    embeds = tiny_fp32_model.get_input_embeddings()(batch.input_ids)
    # The cache goes by position: transformers 5.24 renamed it `past_key_values` -> `cache`
    # and removes the old keyword in 5.40, both inside tinyrl's transformers range.
    mask = create_causal_mask(tiny_fp32_model.config, embeds, batch.attention_mask, None,
                              position_ids=batch.position_ids)
    assert mask is not None and mask.dtype == torch.bool          # (1): not the is_causal path
    attends_to_nothing = ~mask.any(dim=-1)                          # [B, 1, T]
    assert attends_to_nothing[0, 0, :2].all()                       # the 2 left-pad positions
    q = torch.randn(1, 1, mask.shape[-1], 8)
    scores = (q @ q.transpose(-1, -2)).masked_fill(~mask[:1], float("-inf"))
    assert torch.isneginf(torch.logsumexp(scores, dim=-1)[0, 0, :2]).all()  # (3)
