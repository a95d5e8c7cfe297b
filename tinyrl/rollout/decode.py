"""tinyrl's own sampling loop for transformers causal LMs: prefill once, then one token per step
through the KV cache. Replaces `model.generate` in the HF engine (issue 16).

Why not `generate`: for a small model every decode step is bound by per-op Python and dispatch
overhead, and generate's own per-step work (stopping criteria, kwargs bookkeeping, a fresh
[B, 1, 1, L] mask built through masking_utils' vmapped mask functions, the input_ids cat) costs
as much as the model's forward at these sizes (benchmarks/hf_engine_speed.py).

Same distribution as generate (transformers 5.19 generation/utils.py `_sample`): logits of the
last position in fp32, the warpers (temperature, then top_p: transformers' own classes), then
`torch.multinomial(softmax(scores), 1)` (the same RNG draws, so a seed gives generate's tokens),
or argmax when greedy; a finished row gets the pad token and stays finished. Prompt rows are
left-padded; position ids count real tokens only (generate's `cumsum(mask) - 1`).

Finished rows leave the batch (issue 16): once half the rows computed have stopped, the rest
go on alone (their KV cache rows selected), so the long tail of a rollout (a Countdown batch
stops at ~29 tokens on average but runs to 64) costs the rows still sampling, not the whole
batch. The RNG stream stays the full batch's: each step draws generate's Exp(1) numbers for
every row and the live rows use theirs (`_multinomial`).

On a CPU whose OpenMP threads sleep between ops (OMP_WAIT_POLICY=PASSIVE) the decode steps run
on one thread (`decode_threads`).

What this file does not know: adapters, engines, seeds, completions.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os

import torch

from tinyrl.errors import TinyRLError

# Attention implementations that take a boolean [B, 1, Q, K] mask as is (True: attend).
# "tinyrl_packed" is sdpa for unpacked inputs (tinyrl.packing). Eager adds the mask to the
# scores, so it needs a float mask: it keeps transformers' own mask building, as do others.
_BOOL_MASK_ATTENTION = {"sdpa", "tinyrl_packed"}


def sample_tokens(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, *, n: int, max_new_tokens: int,
                  stop_ids: list[int], pad_id: int, warpers: list, greedy: bool,
                  generators: list[torch.Generator] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, mask [P, W] left-padded prompts -> (tokens [P * n, steps], log-probs [P * n, steps]
    fp32); row r samples prompt r // n (generate's `num_return_sequences` order).

    Each prompt is prefilled once and its KV cache then repeated n times: the n samples share
    the prompt, so generate's prefill of P * n rows computes every prompt n times (the largest
    single cost of a rollout at a few dozen new tokens).

    steps <= max_new_tokens: the loop ends when every row has hit a stop id. After its stop token
    a row holds pad_id (log-prob 0 there: callers cut rows at the stop token). Log-probs are
    those of the distribution sampled from (after the warpers); greedy: log_softmax of the raw
    logits. Runs under the caller's no_grad / eval mode.

    generators [P * n] (None: the global RNG, drawn for the whole batch as generate does): row r
    draws from its own generator only, so its tokens do not depend on which other rows share the
    batch (the turn loop's episodes, continued in batches that tool timings decide)."""
    tokens, logprobs, _ = _sample(model, ids, mask, n=n, max_new_tokens=max_new_tokens, stop_ids=stop_ids,
                                  pad_id=pad_id, warpers=warpers, greedy=greedy, generators=generators)
    return tokens, logprobs


def can_keep_cache(model: torch.nn.Module) -> bool:
    """Whether `sample_tokens_kept` can run for this model: the decode loop's own boolean masks
    and preallocated layers (sdpa, full attention only; a sliding-window layer drops keys)."""
    config = _config(model)
    return config._attn_implementation in _BOOL_MASK_ATTENTION and set(_layer_types(config)) == {"full_attention"}


class RowCache:
    """One sequence's kept KV cache: per layer (keys, values) [H, L, D] of its L real tokens
    (positions 0..L-1, no padding), what a later turn's prefill goes on from."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.layers = layers
        self.length = layers[0][0].shape[-2]


def sample_tokens_kept(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, *, n: int,
                       max_new_tokens: int, stop_ids: list[int], pad_id: int, warpers: list, greedy: bool,
                       past: list[RowCache] | None = None, generators: list[torch.Generator] | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, list[RowCache | None]]:
    """sample_tokens that keeps each row's cache for a next turn (the turn loop, issue 28.4).

    past None: as sample_tokens. past [P] (n = 1): row r's context so far is past[r] and ids[r]
    (mask [P, Q], left-padded) are the tokens added since (the previous turn's stop token, which
    was sampled but never fed, then the tool turn): only those are prefilled, on top of past[r],
    at positions past[r].length + 0, 1, ... (what re-prefilling the whole context gives them).

    -> tokens, log-probs as sample_tokens, and per row [P * n] the cache of its context and its
    tokens BEFORE its stop token (the stop token is fed by the next turn's prefill: a row's
    cache is the same whether the loop ran on after it stopped or not); None for a row that did
    not stop (its episode cannot continue). Needs can_keep_cache(model)."""
    return _sample(model, ids, mask, n=n, max_new_tokens=max_new_tokens, stop_ids=stop_ids, pad_id=pad_id,
                   warpers=warpers, greedy=greedy, past=past, keep=True, generators=generators)


def _sample(model, ids, mask, *, n, max_new_tokens, stop_ids, pad_id, warpers, greedy, past=None, keep=False,
            generators=None):
    """The decode loop of sample_tokens / sample_tokens_kept (their docstrings)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    W, B = ids.shape[1], ids.shape[0] * n
    device = ids.device
    config = _config(model)
    cache = DynamicCache(config=config)
    cache_kw = _cache_kwarg(model)
    if past is None:
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)      # [B, W]
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, **{cache_kw: cache},
                       use_cache=True, logits_to_keep=1).logits                  # prefill: transformers' masks
    else:  # a later turn: the added tokens only, on top of each row's kept cache
        assert n == 1 and len(past) == ids.shape[0], "a later turn samples once per kept row"
        logits, mask, positions = _prefill_on(model, cache, past, ids, mask, max_new_tokens)
        W = mask.shape[1]                                                        # kept + added slots
    if n > 1:
        cache.batch_repeat_interleave(n)
        logits, mask, positions = (t.repeat_interleave(n, dim=0) for t in (logits, mask, positions))
    # Decode steps: the mask over the keys so far is a view of one preallocated [B, W + T]
    # tensor, handed to the layers as the ready-made mask mapping (Qwen2Model.forward uses a
    # dict "as is"), so no mask is built per step.
    bool_masks = config._attn_implementation in _BOOL_MASK_ATTENTION and set(_layer_types(config)) == {"full_attention"}
    keys = torch.zeros(B, W + max_new_tokens, dtype=torch.bool if bool_masks else mask.dtype, device=device)
    keys[:, :W] = mask.bool() if bool_masks else mask
    if bool_masks:  # layer sizes are never read for masks then (measured 3-5% faster than the cat)
        cache.layers = [_Preallocated(layer, W + max_new_tokens) if type(layer) is DynamicLayer else layer
                        for layer in cache.layers]
    position = positions[:, -1:]                                                 # [B, 1]
    steps = grouped_decode_attention(model) if bool_masks else contextlib.nullcontext()
    stops = torch.tensor(stop_ids, device=device)
    compactable = bool_masks and all(type(layer) is _Preallocated for layer in cache.layers)
    if keep and not compactable:
        raise ValueError("keeping the KV cache needs can_keep_cache(model)")
    rows = torch.arange(B, device=device)            # [L] the batch rows still computed (L <= B)
    unfinished = torch.ones(B, dtype=torch.bool, device=device)                  # [L]
    stopped_at = torch.full((B,), -1, device=device)  # [B] the step each row sampled its stop token at
    kept: list[RowCache | None] = [None] * B
    tokens, logprobs = [], []
    with decode_threads(device), steps:
        for step in range(max_new_tokens):
            if step:
                keys[:, W + step - 1] = True
                position = position + 1
                step_mask = keys[:, None, None, :W + step] if bool_masks else keys[:, :W + step]
                step_mask = {"full_attention": step_mask} if bool_masks else step_mask
                logits = model(input_ids=token[:, None], attention_mask=step_mask, position_ids=position,
                               **{cache_kw: cache}, use_cache=True).logits
            scores = logits[:, -1].float()                                           # [L, V]
            for warper in warpers:
                scores = warper(None, scores)
            logp = torch.log_softmax(scores, dim=-1)
            if greedy:
                token = torch.argmax(scores, dim=-1)
            else:
                token = _multinomial(torch.softmax(scores, dim=-1), rows, B, generators)
            token = torch.where(unfinished, token, pad_id)
            step_logp = logp.gather(1, token[:, None])[:, 0].masked_fill(~unfinished, 0.0)
            del scores, logp  # the fp32 [L, V] temporaries are gone before the next forward (the plan counts so)
            tokens.append(_scatter(token, rows, B, pad_id))
            logprobs.append(_scatter(step_logp, rows, B, 0.0))
            stopping = unfinished & torch.isin(token, stops)
            unfinished = unfinished & ~stopping
            if keep:
                stopped_at[rows[stopping]] = step
            live = int(unfinished.sum())  # one host sync a step, as generate's own stop check
            if not live:
                break
            if compactable and live <= len(rows) // 2:  # drop finished rows from the batch
                stay = unfinished.nonzero()[:, 0]
                if keep:  # the rows leaving the batch take their caches along
                    _keep_rows(cache, keys, W, rows, (~unfinished).nonzero()[:, 0], stopped_at, kept)
                rows, token, position, keys, unfinished = (t[stay] for t in (rows, token, position, keys, unfinished))
                for layer in cache.layers:
                    layer.select(stay)
    if keep:
        _keep_rows(cache, keys, W, rows, (stopped_at[rows] >= 0).nonzero()[:, 0], stopped_at, kept, release=True)
    tokens, logprobs = torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1)
    if bool(torch.isnan(logprobs).any()):  # torch.multinomial's own check, once per rollout
        raise TinyRLError("the model's logits became NaN while sampling a rollout",
                          hint="the weights have diverged: lower actor.lr, or resume from an earlier checkpoint")
    return tokens, logprobs, kept


def _prefill_on(model, cache, past: list[RowCache], ids: torch.Tensor, added: torch.Tensor, max_new_tokens: int):
    """Prefill ids [P, Q] (added [P, Q] marks the real ones, left-padded) on top of the rows'
    kept caches. The caches are laid out left-padded in _Preallocated layers of C + Q + T slots
    (C = the longest kept), so the decode loop goes on in them. -> (logits [P, 1, V], the slots'
    mask [P, C + Q], positions [P, Q]: row r's added tokens at past[r].length + 0, 1, ...)."""
    P, Q = ids.shape
    device = ids.device
    lengths = torch.tensor([r.length for r in past], device=device)             # [P]
    C = int(lengths.max())
    slots = C + Q
    layers = []
    for i in range(len(past[0].layers)):  # one layer at a time: a row's kept tensors go once copied
        k0, v0 = past[0].layers[i]
        k = k0.new_zeros(P, k0.shape[0], slots + max_new_tokens, k0.shape[-1])   # [P, H, C + Q + T, D]
        v = v0.new_zeros(P, v0.shape[0], slots + max_new_tokens, v0.shape[-1])
        for r, row in enumerate(past):
            rk, rv = row.layers[i]
            k[r, :, C - row.length:C] = rk
            v[r, :, C - row.length:C] = rv
            row.layers[i] = None
        layers.append(_Preallocated.of(k, v, C))
    cache.layers = layers
    kept_mask = torch.arange(C, device=device)[None, :] >= (C - lengths)[:, None]  # [P, C]
    mask = torch.cat([kept_mask, added.bool()], dim=1)                           # [P, C + Q]
    positions = (lengths[:, None] + added.long().cumsum(-1) - 1).masked_fill(added == 0, 0)  # [P, Q]
    causal = torch.arange(slots, device=device)[None, :] <= C + torch.arange(Q, device=device)[:, None]  # [Q, C + Q]
    attend = mask[:, None, None, :] & causal[None, None]                        # [P, 1, Q, C + Q]
    logits = model(input_ids=ids, attention_mask={"full_attention": attend}, position_ids=positions,
                   **{_cache_kwarg(model): cache}, use_cache=True, logits_to_keep=1).logits
    return logits, mask, positions


def _keep_rows(cache, keys: torch.Tensor, W: int, rows: torch.Tensor, which: torch.Tensor,
               stopped_at: torch.Tensor, kept: list, release: bool = False) -> None:
    """Copy out the caches of batch positions `which` (rows that stopped): each row's context
    slots (keys[:, :W]) and the slots of its tokens before its stop token (W .. W + stop - 1).
    release: the batch is done, each layer's buffers go as soon as its rows are copied, so the
    copies and the batch's cache never coexist beyond one layer (the plan's hf_kv_cache)."""
    picked = [(i, int(rows[i])) for i in which.tolist()]
    slots = {row: torch.cat([keys[i, :W].nonzero()[:, 0],
                             torch.arange(W, W + int(stopped_at[row]), device=keys.device)]) for i, row in picked}
    layers: dict[int, list] = {row: [] for _, row in picked}
    for layer in cache.layers:
        for i, row in picked:
            layers[row].append((layer._k[i].index_select(-2, slots[row]), layer._v[i].index_select(-2, slots[row])))
        if release:
            layer._k = layer._v = None
    for row, kv in layers.items():
        kept[row] = RowCache(kv)


GROUPED_DECODE_ATTENTION = "tinyrl_grouped_decode"


def _grouped_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                              is_causal=None, **kwargs):
    """One decode step's attention without copying K/V to every query head: query [B, Hq, 1, D],
    key/value [B, Hkv, K, D], a bool mask [B, 1, 1, K] -> ([B, 1, Hq, D], None).

    transformers' sdpa (5.19 and 5.20.2 integrations/sdpa_attention.py `use_gqa_in_sdpa`) passes
    `enable_gqa` only without a mask on CUDA (and CPU); with one it runs `repeat_kv`, a copy of
    the layer's whole K and V to all query heads at every layer and step (Qwen2.5-3B, 256 rows,
    1,174 keys: 2.46 GB; memory/formulas.py `kv_expansion_bytes`). A decode step has one query
    per head, and query head h reads kv head h // G (repeat_kv's order), so the G query heads of
    a group become G query rows of their kv head: the same scores, softmax and weighted sum per
    (row, head), one sdpa call, any mask, nothing copied. Anything else (a prefill, no mask, no
    grouping) goes to transformers' sdpa as before."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    B, Hq, Q, D = query.shape
    Hkv = key.shape[1]
    if Q != 1 or Hkv == Hq or attention_mask is None or attention_mask.dtype != torch.bool:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(B, Hkv, Hq // Hkv, D), key, value, attn_mask=attention_mask, dropout_p=dropout,
        scale=scaling)                                                            # [B, Hkv, G, D]
    return out.reshape(B, Hq, 1, D).transpose(1, 2), None                        # [B, 1, Hq, D]


@contextlib.contextmanager
def grouped_decode_attention(model: torch.nn.Module):
    """The model's layers use `_grouped_decode_attention` inside (its decode steps get their
    masks ready-made from the loop, so no mask function is ever asked for); every config's
    attention implementation is restored after, on an error too."""
    from transformers import AttentionInterface

    AttentionInterface.register(GROUPED_DECODE_ATTENTION, _grouped_decode_attention)
    configs = {id(c): c for m in model.modules()
               if (c := getattr(m, "config", None)) is not None and hasattr(c, "_attn_implementation")}
    before = {k: c._attn_implementation for k, c in configs.items()}
    try:
        for c in configs.values():
            c._attn_implementation = GROUPED_DECODE_ATTENTION
        yield
    finally:
        for k, c in configs.items():
            c._attn_implementation = before[k]


def decode_threads(device: torch.device) -> contextlib.AbstractContextManager:
    """Decode steps on one CPU thread when OpenMP's threads sleep between ops (issue 16).

    A decode step is a chain of small ops (the tiny model: [32, 128] x [128, 384] matmuls).
    With OMP_WAIT_POLICY=PASSIVE (what .ci/run and benchmarks/vs_trl.py set, so that busy
    cores do not starve) every parallel op wakes the sleeping threads first: on this project's
    2-core machine a 32x128x384 matmul took 142 us on 2 such threads and 39 us on 1, and the
    rollout of 8 prompts x 4 was 1.63x faster with its decode steps on 1 thread. Spinning
    threads (ACTIVE, or an unset policy) pay no wake-up (28 us) and 2 of them beat 1 (0.87x,
    0.92x), so the count is left alone then (benchmarks/decode_threads.py prints these).

    The choice follows the environment, never a timing, so a run and its resume decode alike.
    Tokens were the same on 1 and 2 threads in every seed measured; log-probs may differ in the
    last bits (a matmul's sums split differently), as they do between machines. The prefill and
    the training passes (large matmuls) keep every thread. On CUDA: untouched (host threads
    only launch kernels there)."""
    return torch_threads(decode_thread_count(device))


def decode_thread_count(device: torch.device) -> int:
    """The torch threads decode steps run on (decode_threads says why)."""
    passive = os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
    return 1 if device.type == "cpu" and passive else torch.get_num_threads()


@contextlib.contextmanager
def torch_threads(count: int):
    """torch's intra-op thread count is `count` inside, what it was after (even on an error)."""
    before = torch.get_num_threads()
    if count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _multinomial(probs: torch.Tensor, rows: torch.Tensor, B: int,
                 generators: list[torch.Generator] | None = None) -> torch.Tensor:
    """probs [L, V] of batch rows `rows` [L] -> one token per row [L]: torch.multinomial's own
    one-sample algorithm with the draws of the whole [B, V] batch, so dropping finished rows
    leaves the RNG stream, and every token, as the full batch's.

    torch 2.13 aten/src/ATen/native/Distributions.cpp `multinomial_out`, the fast path for one
    sample (CPU and CUDA alike): `q = empty_like(p).exponential_(); argmax(p / q)`. Its input
    checks (max, min and row sums read on the host: three syncs a step) are left out: a NaN
    shows in the log-probs and is reported once per rollout.

    generators [B]: each computed row draws its own [V] numbers from its own generator (a
    dropped row draws no more; its later draws are never used)."""
    if generators is not None:
        q = torch.stack([torch.empty(probs.shape[1], dtype=probs.dtype, device=probs.device)
                         .exponential_(generator=generators[r]) for r in rows.tolist()])
        return (probs / q).argmax(dim=-1)
    q = torch.empty(B, probs.shape[1], dtype=probs.dtype, device=probs.device).exponential_()
    if len(rows) < B:
        q = q.index_select(0, rows)
    return (probs / q).argmax(dim=-1)


def _scatter(values: torch.Tensor, rows: torch.Tensor, B: int, fill) -> torch.Tensor:
    """values [L] of batch rows `rows` -> [B], `fill` elsewhere."""
    if len(rows) == B:
        return values
    return torch.full((B,), fill, dtype=values.dtype, device=values.device).index_copy_(0, rows, values)


class _Preallocated:
    """A DynamicLayer's keys/values moved into [B, H, W + T, D] buffers that decode steps write
    into: DynamicLayer.update (transformers 5.19 cache_utils.py) cats the whole cache per layer
    per step. Masks come from the decode loop, never from this layer's sizes."""

    is_sliding = False

    def __init__(self, layer, total: int) -> None:
        k, v = layer.keys, layer.values
        self.length = k.shape[-2]
        self._k = k.new_empty(*k.shape[:-2], total, k.shape[-1])
        self._v = v.new_empty(*v.shape[:-2], total, v.shape[-1])
        self._k[..., :self.length, :] = k
        self._v[..., :self.length, :] = v
        self.is_initialized = True

    @classmethod
    def of(cls, k: torch.Tensor, v: torch.Tensor, length: int) -> "_Preallocated":
        """Buffers k, v [B, H, total, D] whose first `length` slots are filled."""
        layer = cls.__new__(cls)
        layer._k, layer._v, layer.length, layer.is_initialized = k, v, length, True
        return layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start, self.length = self.length, self.length + key_states.shape[-2]
        self._k[..., start:self.length, :] = key_states
        self._v[..., start:self.length, :] = value_states
        return self._k[..., :self.length, :], self._v[..., :self.length, :]

    def select(self, keep: torch.Tensor) -> None:
        self._k, self._v = self._k.index_select(0, keep), self._v.index_select(0, keep)

    def get_seq_length(self) -> int:
        return self.length


def _base(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (the model itself when there is none)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _config(model: torch.nn.Module):
    return _base(model).config


def _cache_kwarg(model: torch.nn.Module) -> str:
    """The forward's keyword for the KV cache: `cache` from transformers 5.24 on (which still takes
    `past_key_values` but warns that 5.40 removes it: generic.py `_rename_kwargs_for_bc`,
    `@deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")`), `past_key_values`
    before. A removed keyword would not fail: the forward's **kwargs would swallow it, and every
    decode step would attend only to itself (a fresh cache). So the name is read from the
    model class's own signature, not assumed."""
    return _forward_cache_kwarg(type(_base(model)))


@functools.cache
def _forward_cache_kwarg(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def _layer_types(config) -> list[str]:
    return list(getattr(config, "layer_types", None) or ["full_attention"])
