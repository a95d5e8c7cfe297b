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
    episodes: list       # kept episodes (tinyrl.rollout.base.Episode); prompt_index points into `rows`
    rows: list[int]      # dataset row of each kept group
    scored: Scores       # the kept episodes' rewards, in the order of `episodes`
    rounds: int          # generation rounds used
    groups_seen: int     # groups generated in all rounds
    groups_kept: int = 0  # groups with a spread of rewards among `rows` (0: the unfiltered fallback)


def fill_batch(rows: list[int], more_rows: Callable[[int], list[int]], generate: Callable[[list[int]], list],
               score: Callable[[list, list[int]], Scores], batch_size: int, max_rounds: int) -> Filled:
    """rows: the step's prompts; more_rows(round) -> the next round's prompts; generate(rows) ->
    episodes (prompt_index into rows); score(episodes, rows) -> their Scores."""
    out = Filled([], [], Scores(parts=None), 0, 0)
    for round_ in range(max_rounds):
        if round_:
            more = more_rows(round_)
            if not more:  # the data set has no prompt left that this step has not rolled out
                break
            rows = more
        episodes = generate(rows)
        scored = score(episodes, rows)
        out.rounds, out.groups_seen = round_ + 1, out.groups_seen + len(rows)
        keep = groups_with_variance(torch.tensor(scored.total),
                                    torch.tensor([e.prompt_index for e in episodes])).tolist()
        renumber: dict[int, int] = {}
        for i, e in enumerate(episodes):
            if not keep[i]:
                continue
            if e.prompt_index not in renumber:
                if len(out.rows) == batch_size:
                    continue
                renumber[e.prompt_index] = len(out.rows)
                out.rows.append(rows[e.prompt_index])
            e.prompt_index = renumber[e.prompt_index]
            out.episodes.append(e)
            out.scored.append(scored, i)
        if len(out.rows) == batch_size:
            break
    out.groups_kept = len(out.rows)
    if not out.rows:  # every group of every round was flat: train on the last round as it is
        # (a grouped estimator's advantage is then the overlong penalty's and an in-reward KL's only)
        out.episodes, out.rows, out.scored = episodes, list(rows), scored
    return out


def unseen_rows(order: list[int], seen: set[int], k: int) -> list[int]:
    """The first k rows of `order` not in `seen` (the step's rows and earlier rounds'), added to
    `seen`. A group drawn twice in one step would count one prompt twice in the batch and its
    loss; fewer than k when the data set runs out."""
    out = [r for r in order if r not in seen][:k]
    seen.update(out)
    return out
