"""Padding-free training passes: a padded Batch's real tokens packed into one row.

Knows: a Batch's layout (left-padded prompt + right-padded response, position ids that count
real tokens only, so they restart at 0 in every row) and transformers' attention interface.
Does not know: RL, roles, configs.

The packed row holds only real tokens, and a prompt shared by several rows (GRPO's n samples of
one prompt, found by content) only once: causal attention makes a prompt's hidden states
independent of what follows it, so its linears, MLP and norms run once and its states are
gathered into every row that has it (tokens computed / real tokens < 1 then; = 1 when no
prompt repeats). Position ids come from the padded batch, so RoPE sees each sequence exactly as
there. Attention must stay within a sequence: transformers (5.19, masking_utils.py:856-862 and
974-976) would notice the restarting position ids and build a block-diagonal [N, N] mask for
sdpa/eager, which makes attention quadratic in the TOTAL token count (N = 5,700 here: 25x the
work of the padded batch's attention). So the models get one more attention implementation,
"tinyrl_packed": given a Layout (keyword `tinyrl_layout`) it runs sdpa per sequence (see
`_packed_attention`); without one (generation, any other caller) it is transformers' own sdpa,
mask and all. The layout reaches every layer as a keyword argument of the body's forward
(Qwen2Model passes **kwargs to each decoder layer, and GradientCheckpointingLayer to its
recomputation too).
Every gather here is `index_select`, never advanced indexing (`x[idx]`): on the CPU the
backward of `x[idx]` is index_put_(accumulate=True), which with 2+ threads and 32,768+ elements
adds float32 with atomics in whatever order the threads reach a repeated index (torch 2.13,
aten/src/ATen/native/cpu/IndexKernel.cpp index_put_kernel: cpu_atomic_add_float), so a shared
prompt's gradient, the sum over its rows, changed in the last bits from run to run, and the
demo's RL result with it (seed 2: -1.2 and +22.3 points on the same code). index_select's
backward is index_add_, a serial loop over the indices on the CPU (TensorAdvancedIndexing.cpp
index_add_cpu_out): the same order every run. On CUDA index_add_ uses atomic adds, so there
a shared prompt's gradient may still differ in the last bits between runs (unless
torch.use_deterministic_algorithms).
The layout is index work on the host over the batch's mask: it runs on real tensors even under
the memory simulation's FakeTensorMode (`host_index_work`), so the simulation traces these very
packed passes (its batch's ids and masks are real; the activations stay fake). What the index work
returns reaches the passes as the device would hold it (`as_device_tensor`): under the simulation
a fake copy, so the plan counts the layout's bytes too (its mask is the size of a row's attention
scores: B x Rq x Lk bytes).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from tinyrl.errors import TinyRLError

PACKED_ATTENTION = "tinyrl_packed"


@dataclass
class Layout:
    """Where a packed row's tokens sit. The packed row [N] holds each distinct prompt of the batch
    once, then every row's response. Attention runs in two right-padded layouts, the index
    tensors naming the packed token in each slot (padding slots name token 0):
      prompts   `p_src` [G * Lp]: each distinct prompt, causal;
      responses `q_src` [B * Rq] the queries, `k_src` [B * Lk] the keys (the row's prompt, then
                its response), `mask` [B, 1, Rq, Lk] (key k is seen by query i iff k <= prompt + i).
    `dest` [N] is the slot of each packed token in the two outputs laid end to end, `hidden`
    [B, T] the packed token at each place of the padded batch (N: padding, a zero row).
    When no prompt is shared (SFT, PPO's one answer a prompt) there is one part: each sequence
    whole in `k_src`, causal, `dest` into it (the float sums of the layout before prompts were
    shared: the demo's SFT end point is sensitive to them, README)."""

    p_src: torch.Tensor
    q_src: torch.Tensor
    k_src: torch.Tensor
    mask: torch.Tensor | None  # None: no shared prompt (one part)
    dest: torch.Tensor
    hidden: torch.Tensor
    shapes: tuple[int, int, int, int, int]  # G, Lp, B, Rq, Lk


def _packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    """query [1, Hq, N, D], key/value [1, Hkv, N, D] -> ([1, N, Hq, D], None), causal within
    each sequence of the packed `tinyrl_layout` (a Layout)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout = kwargs.pop("tinyrl_layout", None)
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    # Gathered into right-padded per-sequence rows for this call only; one sdpa call per part
    # (per-sequence slices cost a full-size zero tensor each in backward, SliceBackward). Prompts:
    # with the padding AFTER the real tokens plain causal attention is exact for every real
    # query, so no mask (sdpa may take its flash kernel). Responses: each sequence's queries see
    # its prompt (gathered from the one packed copy; the gather's backward sums the sequences'
    # gradients into it) and its own response so far. A shared prompt's queries are computed
    # once, its keys/values once per sequence. Padded queries' outputs are dropped.
    G, Lp, B, Rq, Lk = layout.shapes

    def rows(x: torch.Tensor, src: torch.Tensor, S: int, L: int) -> torch.Tensor:  # -> [S, H, L, D]
        flat = x[0].transpose(0, 1)                                      # [N, H, D]
        return flat.index_select(0, src).view(S, L, *flat.shape[1:]).transpose(1, 2)

    if layout.mask is None:  # no shared prompt: every sequence whole, causal
        out, _ = sdpa_attention_forward(module, rows(query, layout.k_src, B, Lk), rows(key, layout.k_src, B, Lk),
                                        rows(value, layout.k_src, B, Lk), None, dropout=dropout, scaling=scaling,
                                        is_causal=True, **kwargs)     # [B, Lk, Hq, D]
        return out.reshape(B * Lk, *out.shape[2:]).index_select(0, layout.dest)[None], None
    prompts, _ = sdpa_attention_forward(module, rows(query, layout.p_src, G, Lp), rows(key, layout.p_src, G, Lp),
                                        rows(value, layout.p_src, G, Lp), None, dropout=dropout, scaling=scaling,
                                        is_causal=True, **kwargs)     # [G, Lp, Hq, D]
    answers, _ = sdpa_attention_forward(module, rows(query, layout.q_src, B, Rq), rows(key, layout.k_src, B, Lk),
                                        rows(value, layout.k_src, B, Lk), layout.mask, dropout=dropout,
                                        scaling=scaling, is_causal=False, **kwargs)  # [B, Rq, Hq, D]
    out = torch.cat([prompts.reshape(G * Lp, *prompts.shape[2:]), answers.reshape(B * Rq, *answers.shape[2:])])
    return out.index_select(0, layout.dest)[None], None                  # [1, N, Hq, D]


def sliding_window_problem(config) -> str | None:
    """What a model's sliding-window attention layers are, or None when every layer attends to
    all keys. `_packed_attention` is causal over each whole sequence: it would let a sliding
    layer see keys beyond its window, so packed passes refuse such a model."""
    types = list(getattr(config, "layer_types", None) or [])
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if not sliding and not (getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None)):
        return None
    where = f"layers {sliding}" if sliding else "its layers"
    return (f"the model uses sliding-window attention (use_sliding_window = "
            f"{getattr(config, 'use_sliding_window', None)}, sliding_window = {getattr(config, 'sliding_window', None)}, "
            f"{where}), which tinyrl's padding-free passes do not implement")


def use_packed_attention(model: torch.nn.Module) -> None:
    """Give `model` (a causal LM, or a peft model around one) the "tinyrl_packed" attention:
    transformers' sdpa for padded batches, per-sequence attention for packed ones. A model
    with sliding-window layers is refused (TinyRLError): packed, they would see too far."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for m in model.modules():
        problem = sliding_window_problem(getattr(m, "config", None))
        if problem:
            raise TinyRLError(problem, hint="set model.padding_free=false (padded passes use transformers' own "
                              "sliding-window masks), or use a model without sliding-window attention")
    AttentionInterface.register(PACKED_ATTENTION, _packed_attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)  # padded batches: sdpa's own masks
    for m in model.modules():
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = PACKED_ATTENTION


@contextlib.contextmanager
def host_index_work():
    """Integer index work on real tensors, also inside a FakeTensorMode (the memory simulation):
    a fake tensor has no values, and a layout needs the mask's. Outside one it changes nothing."""
    with unset_fake_temporarily():
        yield


def as_device_tensor(t: torch.Tensor) -> torch.Tensor:
    """A result of host index work that a real run holds on the device (a layout's index tensors
    and attention mask, the packed ids): itself, or under the memory simulation's FakeTensorMode a
    fake copy, which the simulation's tracker counts (made by host_index_work, the real tensor is
    invisible to it). Call it outside host_index_work. Values are lost in the copy: only ops that
    need none (index_select, sdpa's mask) may read it afterwards."""
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None:
        return t
    return t.clone()


def real_places(mask: torch.Tensor, width: int | None = None, offset: int = 0) -> torch.Tensor:
    """[B, R] mask -> [n] flat places of its nonzero entries (what `x[mask.bool()]` selects) in a
    [B, width] tensor whose column offset + r is the mask's column r (default: the mask's own
    shape). Found on real values, returned as the device holds them (as_device_tensor); gather
    with index_select, which needs none (fake tensors)."""
    with host_index_work():
        R = mask.shape[1]
        flat = mask.reshape(-1).nonzero()[:, 0]
        places = flat if width is None else flat // R * width + offset + flat % R
    return as_device_tensor(places)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, prompt_len: int,
         share_prompts: bool = True):
    """[B, T] padded (the first `prompt_len` columns the left-padded prompts) -> (input_ids [1, N],
    position_ids [1, N], Layout, the batch's real tokens) where N = the real tokens, less the repeats
    of a prompt shared by several rows (GRPO's n samples of one prompt): a prompt's hidden
    states do not depend on the response after it, so each distinct prompt is computed once.
    share_prompts=False: every row packs its own prompt (one causal part). The inputs must hold
    real values (host index work, see host_index_work); so does everything returned, except under
    the memory simulation's fake tensors (as_device_tensor)."""
    with host_index_work():
        ids, pos, layout, real = _pack(input_ids, attention_mask, position_ids, prompt_len, share_prompts)
    # The memory simulation counts what a real run holds on the device for the pass (the shared
    # prompts' [B, 1, Rq, Lk] mask is the largest: 0.41 GiB at retool-4090's forward micro-batch).
    layout = Layout(**{f.name: as_device_tensor(v) if isinstance(v := getattr(layout, f.name), torch.Tensor) else v
                       for f in fields(Layout)})
    return as_device_tensor(ids), as_device_tensor(pos), layout, real


def _pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, prompt_len: int,
          share_prompts: bool):
    B, T = input_ids.shape
    device = input_ids.device
    mask, ids = attention_mask.bool().cpu(), input_ids.cpu()             # the index work on the host
    real_p = mask[:, :prompt_len]
    # Rows with the same padded prompt (ids and mask) share it; the first of them holds it.
    which = _prompt_ids(ids, real_p)
    first = torch.full((int(which.max()) + 1,), B).scatter_reduce(0, which, torch.arange(B), "amin")
    owner = first[which] if share_prompts else torch.arange(B)           # [B]
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
    # Real tokens of a row are contiguous: the prompt's plen columns before prompt_len, then rlen.
    plen, rlen = real_p.sum(-1), mask[:, prompt_len:].sum(-1)           # [B]
    by_row = packed_of.view(B, T)

    def slots(row_ids: torch.Tensor, col0: torch.Tensor, count: torch.Tensor):
        """-> ([len(row_ids) * L] packed token per slot, L): `count` tokens from column `col0`."""
        L = max(1, int(count.max()) if count.numel() else 1)
        k = torch.arange(L)
        col = (col0[:, None] + k).clamp(max=T - 1)
        return torch.where(k < count[:, None], by_row[row_ids].gather(1, col), 0).view(-1), L

    holders = (owner == torch.arange(B)).nonzero()[:, 0]                 # [G] rows that pack a prompt
    p_src, Lp = slots(holders, prompt_len - plen[holders], plen[holders])
    q_src, Rq = slots(torch.arange(B), torch.full((B,), prompt_len), rlen)
    k_src, Lk = slots(torch.arange(B), prompt_len - plen, plen + rlen)
    see = torch.arange(Lk)[None, None, :] <= (plen[:, None, None] + torch.arange(Rq)[None, :, None])
    G = len(holders)
    b, t = take // T, take % T
    slot_of_holder = torch.zeros(B, dtype=torch.long)
    slot_of_holder[holders] = torch.arange(G)
    if G == B:  # nothing shared: one causal part, each sequence whole
        dest = b * Lk + t - (prompt_len - plen[b])
        layout = Layout(p_src.to(device), q_src.to(device), k_src.to(device), None, dest.to(device), by_row.to(device),
                        (G, Lp, B, Rq, Lk))
    else:
        dest = torch.where(t < prompt_len, slot_of_holder[b] * Lp + t - (prompt_len - plen[b]),
                           G * Lp + b * Rq + t - prompt_len)
        layout = Layout(*(x.to(device) for x in (p_src, q_src, k_src, see[:, None], dest, by_row)), (G, Lp, B, Rq, Lk))
    return input_ids.reshape(-1)[take.to(device)][None], position_ids.reshape(-1)[take.to(device)][None], layout, \
        int(mask.sum())


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int) -> list[int]:
    """[B, T] padded -> each row's prompt as a number: rows with the same number share their
    prompt in a packed pass (pack computes it once for them)."""
    with host_index_work():
        mask = attention_mask[:, :prompt_len].bool().cpu()
        return _prompt_ids(input_ids[:, :prompt_len].cpu(), mask).tolist()


def _prompt_ids(ids: torch.Tensor, real_p: torch.Tensor) -> torch.Tensor:
    """[B, >= P] ids, [B, P] real-prompt mask -> [B] one number per distinct padded prompt."""
    P = real_p.shape[1]
    return torch.unique(torch.cat([ids[:, :P] * real_p, real_p.long()], 1), dim=0, return_inverse=True)[1]


def unpack(packed: torch.Tensor, layout: Layout) -> torch.Tensor:
    """[1, N, H] -> [B, T, H] (a shared prompt's states in each of its rows; zeros at padding;
    differentiable: the gather's backward sums a shared prompt's rows)."""
    flat = torch.cat([packed[0], packed.new_zeros(1, packed.shape[-1])])  # row N: padding
    # index_select, not flat[layout.hidden]: its backward sums repeats in a fixed order (above)
    return flat.index_select(0, layout.hidden.reshape(-1)).view(*layout.hidden.shape, -1)
