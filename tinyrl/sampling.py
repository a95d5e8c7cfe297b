"""DAPO dynamic sampling: keep only prompt groups whose rewards differ, and roll out more prompts
until the batch holds `batch_size` groups (at most `max_rounds` rounds).

A group whose n samples all score the same has zero GRPO advantage: it costs a forward and an
update and teaches nothing. verl's DAPO (`algorithm.filter_groups`) drops such groups and keeps
generating; so does this, with the filter of tinyrl.rl.shaping.groups_with_variance on the
weighted reward before overlong shaping (verl's metric "reward"). Scoring happens per round, so
only kept groups reach the FORWARD phase. After max_rounds the step trains on what it has
(and on the last round unfiltered when no group had any spread).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tinyrl.rl.shaping import groups_with_variance
from tinyrl.tasks.rewards import Scores


@dataclass
class Filled:
    comps: list          # kept completions; prompt_index points into `rows`
    rows: list[int]      # dataset row of each kept group
    scored: Scores       # the kept completions' rewards, in the order of `comps`
    rounds: int          # generation rounds used
    groups_seen: int     # groups generated in all rounds
    groups_kept: int = 0  # groups with a spread of rewards among `rows` (0: the unfiltered fallback)


def fill_batch(rows: list[int], more_rows: Callable[[int], list[int]], generate: Callable[[list[int]], list],
               score: Callable[[list, list[int]], Scores], batch_size: int, max_rounds: int) -> Filled:
    """rows: the step's prompts; more_rows(round) -> the next round's prompts; generate(rows) ->
    completions (prompt_index into rows); score(completions, rows) -> their Scores."""
    out = Filled([], [], Scores(parts=None), 0, 0)
    for round_ in range(max_rounds):
        if round_:
            rows = more_rows(round_)
        comps = generate(rows)
        scored = score(comps, rows)
        out.rounds, out.groups_seen = round_ + 1, out.groups_seen + len(rows)
        keep = groups_with_variance(torch.tensor(scored.total),
                                    torch.tensor([c.prompt_index for c in comps])).tolist()
        renumber: dict[int, int] = {}
        for i, c in enumerate(comps):
            if not keep[i]:
                continue
            if c.prompt_index not in renumber:
                if len(out.rows) == batch_size:
                    continue
                renumber[c.prompt_index] = len(out.rows)
                out.rows.append(rows[c.prompt_index])
            c.prompt_index = renumber[c.prompt_index]
            out.comps.append(c)
            out.scored.append(scored, i)
        if len(out.rows) == batch_size:
            break
    out.groups_kept = len(out.rows)
    if not out.rows:  # every group of every round was flat: train on the last round as it is
        out.comps, out.rows, out.scored = comps, list(rows), scored  # (zero GRPO advantage: a no-op step)
    return out
