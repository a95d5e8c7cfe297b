"""DAPO dynamic sampling (tinyrl.sampling.fill_batch): flat groups dropped, more prompts rolled
out until the batch is full, bounded rounds, group ids renumbered into the kept rows."""

from __future__ import annotations

from dataclasses import dataclass

from tinyrl.sampling import fill_batch, unseen_rows
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


def test_more_rounds_never_roll_out_a_prompt_the_step_already_has():
    seen = {0, 1, 2}
    assert unseen_rows([2, 7, 0, 5, 1, 9], seen, 2) == [7, 5] and seen == {0, 1, 2, 5, 7}
    assert unseen_rows([5, 9, 7, 3], seen, 3) == [9, 3]    # fewer when the data set runs out
    assert unseen_rows([0, 9, 3], seen, 3) == []


def test_a_round_with_no_prompt_left_ends_the_filling():
    calls = []

    def generate(rows):
        calls.append(list(rows))
        return [C(i, r) for i, r in enumerate(rows) for _ in range(2)]

    def score(comps, rows):
        return Scores([0.0] * len(comps), [False] * len(comps), {"task": [0.0] * len(comps)})

    filled = fill_batch([0, 1], lambda round_: [], generate, score, 2, 4)
    assert calls == [[0, 1]] and filled.rounds == 1 and filled.rows == [0, 1]  # the flat fallback


def test_the_trainers_extra_rounds_roll_out_each_prompt_once(tmp_path):
    """12 prompts, 8 a step, every group flat: the second round can only add the 4 the step has
    not rolled out, and there is no third. Drawn from the whole set, rounds repeated prompts (the
    same group twice in one batch's loss)."""
    from helpers.scripted_engine import ScriptedEngine
    from test_trainer import tiny_config
    from tinyrl.data.countdown import generate_countdown
    from tinyrl.trainer import Trainer

    train, _ = generate_countdown(tmp_path / "data", 12, 4, progress=False)
    cfg = tiny_config(tmp_path, "algorithm.dynamic_sampling=true", "algorithm.adv_estimator=grpo",
                      "rollout.n=2", "algorithm.max_gen_rounds=4", "algorithm.use_kl_loss=false")
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.engine = ScriptedEngine(trainer.inputs.tokenizer, lambda context, j: "no idea")  # all flat
    rolled = []
    generate = trainer.engine.generate
    trainer.engine.generate = lambda prompts, sampling: (rolled.extend(map(tuple, prompts)), generate(prompts, sampling))[1]
    m = trainer.train_step()
    assert len({tuple(p) for p in trainer.inputs.train_prompts}) == 12  # 12 distinct prompts
    assert len(rolled) == len(set(rolled)) == 12 and m["batch/gen_rounds"] == 2
