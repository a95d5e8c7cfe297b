"""Mini-batches split into micro-batches by a token budget, with out-of-memory recovery.

A real out-of-memory error inside a micro-step halves that phase's budget and redoes the whole
mini-batch from zeroed gradients, so no sample is dropped and the update equals the one the
smaller micro-batches would have made from the start.

Losses are weighted so that gradient accumulation is exact: a micro-batch's loss is scaled by
its share of the mini-batch's normaliser (valid tokens for token-mean, sequences otherwise).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from tinyrl.errors import TinyRLError
from tinyrl.memory.probe import free_memory, is_oom

log = logging.getLogger(__name__)


def micro_slices(n_rows: int, seq_len: int, budget_tokens: int, row_tokens: list[int] | None = None,
                 row_width: int | None = None, groups: list[int] | None = None) -> list[slice]:
    """Consecutive row slices of at most budget_tokens // seq_len rows (at least one row); with
    row_tokens (padding-free passes compute only each row's real tokens), slices whose real
    tokens fit the budget instead (at least one row), and of at most budget_tokens // row_width
    rows when row_width is given.

    Why the row cap: a packed pass still holds tensors of rows x padded width (the unpacked
    hidden states, the value head's fp32 input, the attention's per-row gathers), so short rows
    packed by tokens alone make more rows than the memory plan traced (traced, the 3B critic at
    the planned 24,320 tokens: 194 rows of 125 real tokens hold 1.02 GiB more than the plan's 19
    full rows). The plan traces rows = budget // the planned width, every token real
    (memory/simulate.py), the most a packed micro-batch of that many rows can hold.

    groups (padding-free only): each row's shared prompt (models.row_groups). A packed pass
    computes a prompt once per micro-batch holding any of its rows, so a cut inside a run of
    rows sharing a prompt computes it twice: then each cut moves back to where that run
    starts, when that still makes no more slices than cutting where the budget ends."""
    if row_tokens is None:
        rows = max(1, budget_tokens // max(1, seq_len))
        return [slice(i, min(i + rows, n_rows)) for i in range(0, n_rows, rows)]
    max_rows = max(1, budget_tokens // row_width) if row_width else n_rows
    plain = _cut(row_tokens, budget_tokens, max_rows, None)
    aligned = _cut(row_tokens, budget_tokens, max_rows, groups) if groups is not None else plain
    return aligned if len(aligned) <= len(plain) else plain


def _cut(row_tokens: list[int], budget: int, max_rows: int, groups: list[int] | None) -> list[slice]:
    """Greedy slices of at most `budget` real tokens and `max_rows` rows (at least one row); with
    groups, a cut that would split a run of one group moves back to the run's first row, unless
    that run started the slice (then it is longer than a slice and is cut where it must be)."""
    slices, start, used, i = [], 0, 0, 0
    while i < len(row_tokens):
        n = row_tokens[i]
        if i > start and (used + n > budget or i - start == max_rows):
            cut = i
            if groups is not None:
                while cut > start + 1 and groups[cut] == groups[cut - 1]:
                    cut -= 1
                cut = cut if groups[cut] != groups[cut - 1] else i
            slices.append(slice(start, cut))
            start, used, i = cut, 0, cut
            continue
        used += n
        i += 1
    return slices + [slice(start, len(row_tokens))] if row_tokens else slices


def mini_batches(order: torch.Tensor, group_ids: torch.Tensor | None, prompts: int) -> list[torch.Tensor]:
    """One epoch's mini-batches of whole prompts. order [N]: a random permutation of the rows;
    group_ids [N]: the prompt each row answers (None: each row is its own, as in SFT); prompts:
    prompts per mini-batch (ppo_mini_batch_size). -> [rows of mini-batch 0, ...]: every row once,
    a prompt's rows all in one mini-batch, the prompts in the order their first row appears in
    `order`, each mini-batch's rows in `order`'s order.

    Why whole prompts: a padding-free pass computes a prompt once per micro-batch holding any of
    its rows (tinyrl.packing), and rows drawn one by one spread a prompt over every mini-batch:
    countdown-demo-ppo's critic (4 of 32 prompts x 8 samples a mini-batch) computed 0.72 tokens per
    real token against the actor's 0.31 (the whole batch in one mini-batch), and took 45% of a
    step. It is verl's layout too: its rows come grouped by prompt and are cut consecutively
    (verl 0.9.1 workers/engine_workers.py, tensordict_utils.make_iterator, `shuffle: false`).
    With one row per prompt, or one mini-batch of every prompt, the rows are those that
    consecutive cuts of `order` made before (the same runs, bit for bit)."""
    if group_ids is None:
        return [order[i:i + prompts] for i in range(0, len(order), prompts)]
    _, prompt = torch.unique(group_ids[order], return_inverse=True)     # [N] the prompt at each place
    n, n_prompts = prompt.numel(), int(prompt.max()) + 1 if prompt.numel() else 0
    places = torch.arange(n, device=prompt.device)
    first = torch.full((n_prompts,), n, device=prompt.device).scatter_reduce(0, prompt, places, "amin")  # [P]
    drawn = torch.empty_like(first)
    drawn[torch.argsort(first)] = torch.arange(n_prompts, device=prompt.device)  # [P] the prompt's place in the draw
    mini = drawn[prompt] // prompts                                      # [N] each place's mini-batch
    return [order[mini == m] for m in range(-(-n_prompts // prompts))]


def by_prompt(rows: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """rows [M] (a mini-batch's row indices, shuffled) -> the same rows, those answering one
    prompt adjacent (groups in group-id order, each group's rows in their shuffled order).

    Why: micro_slices cuts consecutive rows, and a padding-free pass computes a prompt once per
    micro-batch that holds any of its rows (tinyrl.packing); shuffled rows spread each GRPO
    group over every micro-batch, so the update computed each prompt up to once per micro-batch
    (the demo: 0.54 tokens computed per real token against the forward's 0.29). Which rows
    form the mini-batch is unchanged, and accumulation is exact (accumulate_gradients), so the
    update is the same up to float summation order."""
    return rows[torch.sort(group_ids[rows], stable=True).indices]


def loss_weight(response_mask: torch.Tensor, agg_mode: str) -> float:
    """What a micro-batch's aggregated loss is a mean over: valid tokens (token-mean) or
    sequences (seq-mean-*); seq-mean-token-sum-norm is already a sum over sequences (divided by
    the fixed max length), so each micro-batch counts once."""
    if agg_mode == "token-mean":
        return float(response_mask.sum())
    if agg_mode == "seq-mean-token-sum-norm":
        return 1.0
    return float(response_mask.shape[0])


def loss_normaliser(response_mask: torch.Tensor, agg_mode: str) -> float:
    """The mini-batch's normaliser: the micro-batch weights divide by it. For the Dr.GRPO mode it
    is the sequence count, so the loss is sum(token losses) / (max_len * sequences) whatever the
    micro-batch size (verl divides by the number of micro-batches instead, which makes the
    gradient depend on the micro-batch size)."""
    if agg_mode == "seq-mean-token-sum-norm":
        return float(response_mask.shape[0])
    return loss_weight(response_mask, agg_mode)


class BudgetKeeper:
    """Token budgets per phase; halved on a real OOM, never grown back within a run.
    row_width: the padded row width the budgets were planned at (prompt + response length): a
    padding-free micro-batch holds at most budget // row_width rows, as the plan assumed."""

    def __init__(self, budgets: dict[str, int], row_width: int | None = None):
        self.budgets = dict(budgets)
        self.row_width = row_width
        self.oom_events: list[tuple[str, int, int]] = []  # (phase, old, new)

    def slices(self, phase: str, n_rows: int, seq_len: int, row_tokens: list[int] | None = None,
               groups: list[int] | None = None) -> list[slice]:
        """The micro-batches the phase's budget makes of n_rows rows now."""
        return micro_slices(n_rows, seq_len, self.budgets[phase], row_tokens, self.row_width, groups)

    def run_accumulating(self, phase: str, n_rows: int, seq_len: int,
                         attempt: Callable[[list[slice]], dict], row_tokens: list[int] | None = None,
                         groups: list[int] | None = None) -> dict:
        """Call attempt(slices) (zero grads, forward/backward each slice, return stats);
        on OOM halve the budget and call it again with smaller slices. row_tokens: each row's
        real token count when the passes are padding-free (the budget then counts those);
        groups: each row's shared prompt then (micro_slices)."""
        while True:
            slices = self.slices(phase, n_rows, seq_len, row_tokens, groups)
            try:
                return attempt(slices)
            except (RuntimeError, MemoryError) as exc:
                if not is_oom(exc):
                    raise
                self._halve(phase, seq_len, exc)

    def _halve(self, phase: str, seq_len: int, exc: BaseException) -> None:
        free_memory()
        old = self.budgets[phase]
        if old // seq_len <= 1:
            raise TinyRLError(
                f"out of memory in {phase} with a single sequence of {seq_len} tokens per micro-batch",
                hint="lower rollout.max_response_length, keep model.gradient_checkpointing=true, "
                "lower model.logprob_chunk, or use model.quantize=nf4 / a smaller model",
            ) from exc
        new = max(seq_len, (old // seq_len // 2) * seq_len)
        self.budgets[phase] = new
        self.oom_events.append((phase, old, new))
        log.warning("out of memory in %s: micro-batch budget %d -> %d tokens, redoing the mini-batch",
                    phase, old, new)
