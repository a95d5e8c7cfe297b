"""DAPO dynamic sampling (tinyrl.sampling.fill_batch): flat groups dropped, more prompts rolled
out until the batch is full, bounded rounds, group ids renumbered into the kept rows."""

from __future__ import annotations

from dataclasses import dataclass

from tinyrl.sampling import fill_batch
from tinyrl.tasks.rewards import Scores


@dataclass
class C:  # the fields of a rollout Episode that fill_batch reads
    prompt_index: int
    row: int


def run(reward_of_row, batch_size=3, max_rounds=4, n=2):
    """Rows are ints; a row's samples score reward_of_row(row, sample)."""
    calls = []

    def generate(rows):
        calls.append(list(rows))
        return [C(i, r) for i, r in enumerate(rows) for _ in range(n)]

    def score(comps, rows):
        seen = {}
        total = []
        for c in comps:
            k = seen[c.prompt_index] = seen.get(c.prompt_index, -1) + 1
            total.append(float(reward_of_row(rows[c.prompt_index], k)))
        return Scores(total, [t > 0 for t in total], {"task": total})

    more = lambda round_: [10 * round_ + i for i in range(batch_size)]  # noqa: E731
    return fill_batch([0, 1, 2], more, generate, score, batch_size, max_rounds), calls


def test_flat_groups_are_dropped_and_more_prompts_fill_the_batch():
    # even rows: samples disagree (kept); odd rows: all equal (dropped)
    filled, calls = run(lambda row, k: k if row % 2 == 0 else 1)
    assert calls == [[0, 1, 2], [10, 11, 12]]           # one more round was needed, then it stopped
    assert filled.rows == [0, 2, 10] and filled.rounds == 2 and filled.groups_seen == 6 and filled.groups_kept == 3
    assert [c.prompt_index for c in filled.episodes] == [0, 0, 1, 1, 2, 2]  # renumbered into rows
    assert [c.row for c in filled.episodes] == [0, 0, 2, 2, 10, 10]
    assert filled.scored.total == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert filled.scored.parts["task"] == filled.scored.total


def test_one_round_when_every_group_has_spread():
    filled, calls = run(lambda row, k: k)
    assert len(calls) == 1 and filled.rows == [0, 1, 2] and filled.rounds == 1


def test_rounds_are_bounded_and_a_short_batch_trains():
    filled, calls = run(lambda row, k: k if row == 2 else 0, max_rounds=3)
    assert len(calls) == 3 and filled.rows == [2]        # the only row with spread


def test_all_flat_falls_back_to_the_last_round():
    filled, calls = run(lambda row, k: -1, max_rounds=2)
    assert len(calls) == 2 and filled.rows == [10, 11, 12] and len(filled.episodes) == 6
    assert filled.groups_kept == 0  # logged as batch/groups_kept: the fallback is visible
