"""Padding-free training passes: a padded Batch's real tokens packed into one row.

Knows: a Batch's layout (left-padded prompt + right-padded response, position ids that count
real tokens only, so they restart at 0 in every row) and transformers' attention interface.
Does not know: RL, roles, configs.

The packed row holds only real tokens (tokens computed / real tokens = 1.0); its position ids
restart per sequence, so RoPE sees each sequence exactly as in the padded batch. Attention must
stay within a sequence: transformers (5.19, masking_utils.py:856-862 and 974-976) would notice the
restarting position ids and build a block-diagonal [N, N] mask for sdpa/eager, which makes
attention quadratic in the TOTAL token count (N = 5,700 here: 25x the work of the padded batch's
attention). So the models get one more attention implementation, "tinyrl_packed": given the
sequence boundaries (`cu_seq_lens_q`, the keyword transformers' flash-attention varlen path
uses, modeling_flash_attention_utils.py) it runs causal sdpa per sequence, no mask at all;
without them (generation, any other caller) it is transformers' own sdpa, mask and all.
The boundaries reach every layer as keyword arguments of the body's forward (Qwen2Model passes
**kwargs to each decoder layer, and GradientCheckpointingLayer to its recomputation too).
"""

from __future__ import annotations

import torch

PACKED_ATTENTION = "tinyrl_packed"


def _packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    """query [1, Hq, N, D], key/value [1, Hkv, N, D] -> ([1, N, Hq, D], None), causal within
    each sequence of `cu_seq_lens_q` ([S + 1] offsets into N)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = kwargs.pop("cu_seq_lens_q", None)
    kwargs.pop("cu_seq_lens_k", None)
    if bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    # Each sequence to its own row of a right-padded [S, L] layout for this call only: with the
    # padding AFTER the real tokens, plain causal attention is exact for every real query (its
    # keys 0..j are all real), so sdpa needs no mask and may take its flash kernel; the padded
    # queries' outputs are dropped. One call instead of one per sequence: per-sequence slices
    # cost a full-size zero tensor each in backward (SliceBackward), 0.1 s a step here.
    N, lengths = query.shape[2], torch.tensor(bounds[1:]) - torch.tensor(bounds[:-1])
    S, L = len(lengths), int(lengths.max())
    starts = torch.arange(S) * L - torch.tensor(bounds[:-1])
    where = (torch.repeat_interleave(starts, lengths) + torch.arange(N)).to(query.device)  # [N] into S * L

    def rows(x: torch.Tensor) -> torch.Tensor:                           # [1, H, N, D] -> [S, H, L, D]
        flat = x[0].transpose(0, 1)                                      # [N, H, D]
        padded = flat.new_zeros(S * L, *flat.shape[1:]).index_copy(0, where, flat)
        return padded.view(S, L, *flat.shape[1:]).transpose(1, 2)

    out, _ = sdpa_attention_forward(module, rows(query), rows(key), rows(value), None, dropout=dropout,
                                    scaling=scaling, is_causal=True, **kwargs)   # [S, L, Hq, D]
    return out.reshape(S * L, *out.shape[2:])[where][None], None           # [1, N, Hq, D]


def use_packed_attention(model: torch.nn.Module) -> None:
    """Give `model` (a causal LM, or a peft model around one) the "tinyrl_packed" attention:
    transformers' sdpa for padded batches, per-sequence attention for packed ones."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED_ATTENTION, _packed_attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)  # padded batches: sdpa's own masks
    for m in model.modules():
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = PACKED_ATTENTION


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor):
    """[B, T] padded -> (input_ids [1, N], position_ids [1, N], cu_seq_lens [B + 1] as a list of
    ints, real [B, T] bool) where N = the number of real tokens."""
    real = attention_mask.bool()
    lengths = real.sum(-1)                                               # [B]
    cu = [0] + torch.cumsum(lengths, 0).tolist()
    return input_ids[real][None], position_ids[real][None], cu, real


def unpack(packed: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """[1, N, H] -> [B, T, H] with zeros at padding (differentiable)."""
    B, T = real.shape
    out = packed.new_zeros(B, T, packed.shape[-1])
    out[real] = packed[0]
    return out
