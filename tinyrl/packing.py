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

from dataclasses import dataclass

import torch

PACKED_ATTENTION = "tinyrl_packed"


@dataclass
class Layout:
    """Where a packed row's tokens sit. The packed row [N] holds each distinct prompt of the batch
    once, then every row's response; `src` [S * L] names the packed token in each slot of a
    right-padded [S, L] one-sequence-per-row layout (a shared prompt's tokens appear in each of
    its sequences; padding slots name token 0 and are never attended to), `dest` [N] the one
    slot whose output each packed token takes (a prompt's in its first row), `hidden` [B, T]
    the packed token at each place of the padded batch (N: padding, a zero row)."""

    src: torch.Tensor
    dest: torch.Tensor
    hidden: torch.Tensor
    S: int
    L: int


def _packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    """query [1, Hq, N, D], key/value [1, Hkv, N, D] -> ([1, N, Hq, D], None), causal within
    each sequence of the packed `tinyrl_layout` (a Layout)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout = kwargs.pop("tinyrl_layout", None)
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    # Each sequence to its own row of a right-padded [S, L] layout for this call only: with the
    # padding AFTER the real tokens, plain causal attention is exact for every real query (its
    # keys 0..j are all real), so sdpa needs no mask and may take its flash kernel; the padded
    # queries' outputs are dropped. One call for all sequences: per-sequence slices cost a
    # full-size zero tensor each in backward (SliceBackward). A shared prompt is gathered into
    # each of its sequences here, so only its attention (not its linears, MLP, norms) is
    # computed per sequence; the gather's backward sums the sequences' gradients into it.
    S, L = layout.S, layout.L

    def rows(x: torch.Tensor) -> torch.Tensor:                           # [1, H, N, D] -> [S, H, L, D]
        flat = x[0].transpose(0, 1)                                      # [N, H, D]
        return flat.index_select(0, layout.src).view(S, L, *flat.shape[1:]).transpose(1, 2)

    out, _ = sdpa_attention_forward(module, rows(query), rows(key), rows(value), None, dropout=dropout,
                                    scaling=scaling, is_causal=True, **kwargs)   # [S, L, Hq, D]
    return out.reshape(S * L, *out.shape[2:]).index_select(0, layout.dest)[None], None   # [1, N, Hq, D]


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


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, prompt_len: int):
    """[B, T] padded (the first `prompt_len` columns the left-padded prompts) -> (input_ids [1, N],
    position_ids [1, N], Layout, real [B, T] bool) where N = the real tokens, less the repeats
    of a prompt shared by several rows (GRPO's n samples of one prompt): a prompt's hidden
    states do not depend on the response after it, so each distinct prompt is computed once."""
    B, T = input_ids.shape
    device = input_ids.device
    mask, ids = attention_mask.bool().cpu(), input_ids.cpu()             # the index work on the host
    real_p = mask[:, :prompt_len]
    # Rows with the same padded prompt (ids and mask) share it; the first of them holds it.
    _, which = torch.unique(torch.cat([ids[:, :prompt_len] * real_p, real_p.long()], 1), dim=0, return_inverse=True)
    first = torch.full((int(which.max()) + 1,), B).scatter_reduce(0, which, torch.arange(B), "amin")
    owner = first[which]                                                 # [B]
    keep = mask.clone()
    keep[:, :prompt_len] &= (owner == torch.arange(B))[:, None]          # only the holder packs the prompt
    take = keep.view(-1).nonzero()[:, 0]                                 # [N] into B * T, row-major
    N = take.numel()
    packed_of = torch.full((B * T,), N)
    packed_of[take] = torch.arange(N)
    # A sharer's prompt places are its holder's packed tokens (same columns: same padded prompt).
    at = (owner[:, None] * T + torch.arange(prompt_len)).view(-1)
    sharer = ~keep[:, :prompt_len] & real_p
    packed_of.view(B, T)[:, :prompt_len][sharer] = packed_of[at].view(B, prompt_len)[sharer]
    # Real tokens of a row are contiguous (left-padded prompt, right-padded response).
    lengths = mask.sum(-1)                                               # [B]
    start = T - (~mask).long().flip(-1).cumprod(-1).sum(-1) - lengths    # first real column per row
    L = int(lengths.max())
    k = torch.arange(L)
    valid = k < lengths[:, None]                                         # [B, L]
    col = (start[:, None] + k).clamp(max=T - 1)
    src = torch.where(valid, packed_of.view(B, T).gather(1, col), 0).view(-1)
    b, t = take // T, take % T
    dest = b * L + t - start[b]
    layout = Layout(src.to(device), dest.to(device), packed_of.view(B, T).to(device), B, L)
    return input_ids.reshape(-1)[take.to(device)][None], position_ids.reshape(-1)[take.to(device)][None], layout, \
        attention_mask.bool()


def unpack(packed: torch.Tensor, layout: Layout) -> torch.Tensor:
    """[1, N, H] -> [B, T, H] (a shared prompt's states in each of its rows; zeros at padding;
    differentiable: the gather's backward sums a shared prompt's rows)."""
    flat = torch.cat([packed[0], packed.new_zeros(1, packed.shape[-1])])  # row N: padding
    return flat[layout.hidden]
