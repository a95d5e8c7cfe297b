"""README's first command: `tinyrl sft --preset countdown-demo-sft`, then `tinyrl train --preset
countdown-demo` from that one SFT run on three RL seeds. RL must raise the greedy accuracy on the
same 256 held-back tasks (val/score at step 0, trainer.val_before_train, against the last step).
Assertions are on metrics.jsonl, never on time. Not shortened: 300 SFT steps are what it takes
for the tiny model to copy the numbers at all (200 steps: 3.9%), and 60 RL steps is the preset.

Margin (2026-11-23, 2-core machine, the same commands and data): SFT 8.6% on the 256 tasks;
after 60 GRPO steps the rise on seeds 1-10 was +14.8, +16.8, +17.2, +4.7, +20.3, +25.4, +19.5,
+26.2, +20.7, +18.4 points. A run is bit-for-bit reproducible (seeds 1 and 2 twice each, two
runs at once on the 2 cores: the same weights and figures); before the shared prompt's
gradient was summed in a fixed order (tinyrl.packing) seed 2 gave -1.2 and +22.3 on the same
code, which is why CI once failed here. The outcome is still a chaotic function of the float
sums: a machine that sums in another order (another CPU, another BLAS kernel) draws each seed
afresh, and 1 seed in 10 above (seed 4) did not reach the bar. So the test runs seeds 1-3 and
asks two of them to rise by at least 10 points (26 of 256 tasks); here all three do, the
smallest by 4.8 points more than that. Since 2026-11-24 the update's micro-batches are formed by
prompt, whose float sums differ: seeds 1-10 then gave +16.8, +21.9, +17.2, +7.8, +17.6, +18.0,
+7.4, +22.3, +14.1, +18.8 (default threads, OMP_WAIT_POLICY=PASSIVE as .ci/run sets; seeds 1-3
the same with OMP_NUM_THREADS=1): seeds 1-3 all pass, the smallest by 6.8 points, and 2 seeds
in 10 (4 and 7) stay under the bar. On a machine where each seed fails with chance 1 in 10,
two of three fail with chance 2.8%, at 2 in 10 10.4%; with "both of seeds 1 and 2" it was 19%
(at 1 in 10).
On an AVX-512 machine (2026-11-25; another tiny model, since its kernels sum otherwise) that
8-task setting failed here: SFT 16.4%, seeds 1-6 +0.4, +9.8, +4.7, +7.8, +6.6, +7.0 (a clean-clone
CI run failed on seeds 1 and 2). The preset now has 16 tasks a step: seeds 1-3 +15.2, +15.6,
+17.6 (1 and 2 threads alike), the smallest 5.2 points over the bar; from an SFT run made on 1
thread +23.0 and +28.5.
The SFT end point is sensitive to floating-point order (the padded layout of the same 300 steps
ends at 21.5%, and RL then rose +2.0 to +11.3 points), so this test pins the real preset through
the real CLI rather than hand-picked numbers.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import run_cli
from tinyrl import jsonl

RL_STEPS = 60
SEEDS = (1, 2, 3)
MIN_RISE = 0.10  # measured +0.152, +0.156, +0.176 (AVX-512, 16 tasks a step; module docstring)
MIN_SEEDS_RISING = 2



def rl_records(sft_run: Path, tmp_path: Path, seed: int, preset: str = "countdown-demo") -> list[dict]:
    """metrics.jsonl of `tinyrl train --preset PRESET` from the SFT run; it validated at step 0
    and at the last step, and said so."""
    run = tmp_path / f"{preset}-{seed}"
    done = run_cli("train", "--preset", preset, "--out", str(run), "--no-dashboard",
                   "--max-steps", str(RL_STEPS), "--set", f"model.init_from={sft_run}",
                   "--set", f"trainer.seed={seed}", "--set", f"data.train_path={sft_run.parent / 'data' / 'train.parquet'}")
    records = jsonl.read_records(run / "metrics.jsonl")
    assert records[0]["step"] == 0 and [r for r in records if "val/score" in r][-1]["step"] == RL_STEPS
    assert "before training ->" in done.stdout and "256 held-back test prompts" in done.stdout
    return records


def seeds_until_decided(check: Callable[[int], tuple[bool, object]],
                        order: tuple[int, ...] = SEEDS) -> tuple[int, list]:
    """Run check(seed) over SEEDS (in `order`, a permutation of them) until "MIN_SEEDS_RISING of
    them pass" is decided: when the first two both pass (or both fail) the third cannot change the
    verdict, so it is not run (a PPO seed is minutes of CI). The verdict does not depend on the
    order; the time does. -> (seeds that passed, [(seed, passed, figures)])"""
    assert sorted(order) == sorted(SEEDS), order
    passed, seen = 0, []
    for i, seed in enumerate(order):
        ok, figures = check(seed)
        passed += bool(ok)
        seen.append((seed, bool(ok), figures))
        if passed >= MIN_SEEDS_RISING or passed + len(order) - i - 1 < MIN_SEEDS_RISING:
            break
    return passed, seen


@pytest.mark.parametrize("outcomes, ran, passed", [
    ((True, True, True), [1, 2], 2), ((False, False, True), [1, 2], 0),
    ((True, False, True), [1, 2, 3], 2), ((False, True, False), [1, 2, 3], 1)])
def test_seeds_run_until_two_of_three_is_decided(outcomes, ran, passed):
    got = seeds_until_decided(lambda seed: (outcomes[seed - 1], seed * 10))
    assert got == (passed, [(seed, outcomes[seed - 1], seed * 10) for seed in ran])


@pytest.mark.parametrize("outcomes", [(a, b, c) for a in (True, False) for b in (True, False) for c in (True, False)])
def test_the_order_of_the_seeds_changes_the_time_not_the_verdict(outcomes):
    check = lambda s: (outcomes[s - 1], None)  # noqa: E731
    passed, ran = seeds_until_decided(check, (2, 3, 1))
    assert (passed >= MIN_SEEDS_RISING) == (seeds_until_decided(check)[0] >= MIN_SEEDS_RISING) \
        == (sum(outcomes) >= MIN_SEEDS_RISING)
    assert [seed for seed, _, _ in ran] == ([2, 3] if outcomes[1] == outcomes[2] else [2, 3, 1])


def rise(records: list[dict]) -> float:
    """val/score after the last step minus at step 0 (the same 256 held-back tasks)."""
    return [r for r in records if "val/score" in r][-1]["val/score"] - records[0]["val/score"]


@pytest.mark.slow
# pytest-timeout's 1,500 s (pyproject.toml) counts the SFT fixture too: 8,192 rows, 300 SFT steps
# and two 60-step RL runs with 256-task validations took 100 s (setup) + 376 s (call) = 476 s in
# a full-suite run on the shared 2-core machine (session 3 baseline; a third seed adds ~190 s of
# it), so a 3x slower, busy machine (issue 19's run 1 was 2.6x) would pass 1,500 s and be
# stopped while healthy. 3,600 s is 5.5x that: it still only catches a hang.
@pytest.mark.timeout(3600)
def test_rl_raises_greedy_accuracy_on_held_back_tasks(countdown_demo_sft, tmp_path):
    def check(seed: int) -> tuple[bool, float]:
        gain = rise(rl_records(countdown_demo_sft, tmp_path, seed))
        return gain >= MIN_RISE, round(gain, 3)

    passed, seen = seeds_until_decided(check)
    assert passed >= MIN_SEEDS_RISING, seen


PPO_MIN_EXPLAINED_VAR = 0.10  # median of the last 10 steps; measured +0.13 to +0.31 (seeds 1-7, first machine)
                              # and +0.22 to +0.34 (seeds 1-6, AVX-512 machine): docstring below


@pytest.mark.slow
# 32 tasks x 8 answers a step (4x countdown-demo's batch): a seed took 584 s alone, 1,459-1,486 s with
# two runs at once on the busy shared 2-core machine (before whole-task critic mini-batches made a
# step ~1/3 shorter); 7,200 s for three seeds and the SFT only catches a hang.
@pytest.mark.timeout(7200)
def test_ppo_with_a_critic_raises_accuracy_and_its_critic_learns(countdown_demo_sft, tmp_path):
    """countdown-demo-ppo (PPO/GAE, a LoRA critic) from the same SFT run: on two of seeds 1-3 the
    greedy accuracy rises by 10 points AND the critic explains the returns: the median of
    critic/explained_var over the last 10 steps is at least 0.10 (a critic that learned only the
    batch mean reads ~0.00, the earlier settings' figure; README).

    Margins (2026-11-25, the SFT run README's commands made in a fresh clone, 8.6%; transformers
    5.24 as a fresh install resolves it; 60 steps; three runs at once on the 2-core machine, one
    thread each): since a critic mini-batch holds 4 whole tasks with their 8 answers
    (microbatch.mini_batches) seeds 1-7 gave +28.9 / +0.29, +27.0 / +0.18, +30.1 / +0.31,
    +23.8 / +0.13, +29.3 / +0.16, +28.9 / +0.17, +29.3 / +0.31 (rise in points / median explained variance of steps
    51-60). Every seed passes; the rise clears 10 points by 13.8 or more, the explained
    variance is the tight bar (seed 4 clears it by 0.03), hence two seeds of three. Before, with
    the 32 answers of a critic mini-batch drawn one by one from all 32 tasks, seed 1 gave +26.6
    and -0.03 (it failed), seeds 2 and 3 +29.7 / +0.17 and +28.1 / +0.20. Seeds run in the order
    2, 3, 1: the verdict over the three is the same in any order, and this one stops after two
    runs while 2 and 3 pass. A seed took 518-561 s with three at once, 353-355 s with two (before:
    446 s with two).
    On the AVX-512 machine (2026-11-25, its own tiny model and SFT run, 16.4%; the preset
    unchanged; one thread a run beside two CI runs) seeds 1-6 gave +28.9 / +0.33, +25.0 / +0.22,
    +27.3 / +0.34, +31.3 / +0.24, +25.8 / +0.31, +26.2 / +0.29: every seed passes, the rise by 15.0
    points or more, the explained variance by 0.12 or more (README). In a clean-clone CI run there
    the two seeds this test runs took 787 s together."""
    def check(seed: int) -> tuple[bool, tuple[float, float]]:
        records = rl_records(countdown_demo_sft, tmp_path, seed, preset="countdown-demo-ppo")
        ev = [r["critic/explained_var"] for r in records if "critic/explained_var" in r]
        assert len(ev) == RL_STEPS
        gain, ev_last = rise(records), statistics.median(ev[-10:])
        return gain >= MIN_RISE and ev_last >= PPO_MIN_EXPLAINED_VAR, (round(gain, 3), round(ev_last, 3))

    passed, seen = seeds_until_decided(check, order=(2, 3, 1))
    assert passed >= MIN_SEEDS_RISING, seen
