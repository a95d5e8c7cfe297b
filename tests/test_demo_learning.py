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
                   "--set", f"trainer.seed={seed}", "--set", f"data.train_path={sft_run.parent / 'data' / 'train.parquet'}",
                   machine_threads=True)
    records = jsonl.read_records(run / "metrics.jsonl")
    assert records[0]["step"] == 0 and [r for r in records if "val/score" in r][-1]["step"] == RL_STEPS
    assert "before training ->" in done.stdout and "256 held-back test prompts" in done.stdout
    return records


def seeds_until_decided(check: Callable[[int], tuple[bool, bool, object]],
                        order: tuple[int, ...] = SEEDS) -> tuple[bool, list]:
    """Run check(seed) -> (passed, clear, figures) over SEEDS (in `order`, a permutation of them)
    until the verdict is decided. A first seed that is `clear` (it passes by the wide margin its
    test names, which nearly every seed measured cleared) decides alone: a PPO seed is minutes of
    CI. Otherwise MIN_SEEDS_RISING of the three must pass: when the first two both
    pass (or both fail) the third cannot change that, so it is not run, and without a clear first
    seed the verdict does not depend on the order (the time does).
    -> (verdict, [(seed, passed, clear, figures)] of the seeds run)"""
    assert sorted(order) == sorted(SEEDS), order
    passed, seen = 0, []
    for i, seed in enumerate(order):
        ok, clear, figures = check(seed)
        assert ok or not clear, (seed, figures)  # clear means passed by a margin
        passed += bool(ok)
        seen.append((seed, bool(ok), bool(clear), figures))
        if i == 0 and clear:
            return True, seen
        if passed >= MIN_SEEDS_RISING or passed + len(order) - i - 1 < MIN_SEEDS_RISING:
            break
    return passed >= MIN_SEEDS_RISING, seen


@pytest.mark.parametrize("outcomes, ran, verdict", [
    ((True, True, True), [1, 2], True), ((False, False, True), [1, 2], False),
    ((True, False, True), [1, 2, 3], True), ((False, True, False), [1, 2, 3], False),
    (("clear", False, False), [1], True), ((False, "clear", False), [1, 2, 3], False),
    ((False, "clear", "clear"), [1, 2, 3], True)])
def test_seeds_run_until_two_of_three_is_decided(outcomes, ran, verdict):
    """outcomes[seed - 1]: False, True (passed) or "clear" (passed by the margin)."""
    check = lambda seed: (bool(outcomes[seed - 1]), outcomes[seed - 1] == "clear", seed * 10)  # noqa: E731
    assert seeds_until_decided(check) == (verdict, [(seed, *check(seed)) for seed in ran])


@pytest.mark.parametrize("outcomes", [(a, b, c) for a in (True, False) for b in (True, False) for c in (True, False)])
def test_the_order_of_the_seeds_changes_the_time_not_the_verdict(outcomes):
    check = lambda s: (outcomes[s - 1], False, None)  # noqa: E731
    verdict, ran = seeds_until_decided(check, (2, 3, 1))
    assert verdict == seeds_until_decided(check)[0] == (sum(outcomes) >= MIN_SEEDS_RISING)
    assert [seed for seed, *_ in ran] == ([2, 3] if outcomes[1] == outcomes[2] else [2, 3, 1])


def test_a_clear_seed_decides_alone_only_when_it_runs_first():
    clear_third = lambda s: (s == 3, s == 3, None)  # noqa: E731  (seeds 1 and 2 fail)
    assert seeds_until_decided(clear_third)[0] is False
    verdict, ran = seeds_until_decided(clear_third, (3, 1, 2))
    assert verdict is True and [seed for seed, *_ in ran] == [3]
    with pytest.raises(AssertionError):  # a check that calls a failed seed clear is a bug
        seeds_until_decided(lambda s: (False, True, None))


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
    def check(seed: int) -> tuple[bool, bool, float]:
        gain = rise(rl_records(countdown_demo_sft, tmp_path, seed))
        # Never clear alone: GRPO's seeds spread from +4.7 to +26.2 around the bar of 10 (module
        # docstring), too wide for one seed to speak for the demo.
        return gain >= MIN_RISE, False, round(gain, 3)

    verdict, seen = seeds_until_decided(check)
    assert verdict, seen


PPO_MIN_EXPLAINED_VAR = 0.10  # median of the last 10 steps; measured +0.13 to +0.31 (seeds 1-7, first machine)
                              # and +0.22 to +0.34 (seeds 1-6, AVX-512 machine): docstring below
# The first seed (2) decides alone when it clears both bars by half again (docstring below), so
# CI runs one PPO seed where it ran two.
PPO_CLEAR_RISE, PPO_CLEAR_EXPLAINED_VAR = 1.5 * MIN_RISE, 1.5 * PPO_MIN_EXPLAINED_VAR


@pytest.mark.slow
# 32 tasks x 8 answers a step (4x countdown-demo's batch): a seed took 584 s alone, 1,459-1,486 s with
# two runs at once on the busy shared 2-core machine (before whole-task critic mini-batches made a
# step ~1/3 shorter); 7,200 s for three seeds and the SFT only catches a hang.
@pytest.mark.timeout(7200)
def test_ppo_with_a_critic_raises_accuracy_and_its_critic_learns(countdown_demo_sft, tmp_path):
    """countdown-demo-ppo (PPO/GAE, a LoRA critic) from the same SFT run: on two of seeds 1-3 the
    greedy accuracy rises by 10 points AND the critic explains the returns: the median of
    critic/explained_var over the last 10 steps is at least 0.10 (a critic that learned only the
    batch mean reads ~0.00, the earlier settings' figure; README). Seed 2 runs first and decides
    alone when it clears both bars by half again, +15 points and 0.15: of the 17 runs below since
    a critic mini-batch holds whole tasks (seeds 1-7 on the first machine; on the AVX-512 one
    seeds 1-6, 1-3 and 2) 16 did, all but seed 4 on the first machine (+23.8 / +0.13). A seed
    that passes by less, or fails, brings in seeds 3 and 1 as before, so a critic nearer its bar
    costs CI the second seed rather than passing on one; the bars themselves are unchanged.

    Margins (2026-11-25, the SFT run README's commands made in a fresh clone, 8.6%; transformers
    5.24 as a fresh install resolves it; 60 steps; three runs at once on the 2-core machine, one
    thread each): since a critic mini-batch holds 4 whole tasks with their 8 answers
    (microbatch.mini_batches) seeds 1-7 gave +28.9 / +0.29, +27.0 / +0.18, +30.1 / +0.31,
    +23.8 / +0.13, +29.3 / +0.16, +28.9 / +0.17, +29.3 / +0.31 (rise in points / median explained variance of steps
    51-60). Every seed passes; the rise clears 10 points by 13.8 or more, the explained
    variance is the tight bar (seed 4 clears it by 0.03), hence two seeds of three unless the
    first is clear. Before, with the 32 answers of a critic mini-batch drawn one by one from all
    32 tasks, seed 1 gave +26.6 and -0.03 (it failed), seeds 2 and 3 +29.7 / +0.17 and
    +28.1 / +0.20. Seeds run in the order 2, 3, 1: without a clear seed 2 the verdict over the
    three is the same in any order, and this one stops after two runs while 2 and 3 pass. A seed
    took 518-561 s with three at once, 353-355 s with two (before: 446 s with two).
    On the AVX-512 machine (2026-11-25, its own tiny model and SFT run, 16.4%; the preset
    unchanged; one thread a run beside two CI runs) seeds 1-6 gave +28.9 / +0.33, +25.0 / +0.22,
    +27.3 / +0.34, +31.3 / +0.24, +25.8 / +0.31, +26.2 / +0.29: every seed passes, the rise by 15.0
    points or more, the explained variance by 0.12 or more (README). In a clean-clone CI run there
    seeds 2 and 3 took 787 s together, before seed 2 could decide alone.
    The same machine as CI runs it (2026-11-26: the SFT this test's fixture makes, 16.4%; two
    threads, OMP_WAIT_POLICY=PASSIVE, two runs at once): seeds 1-3 gave +18.8 / +0.23,
    +20.7 / +0.23, +21.1 / +0.18, each clear; seed 2 alone was this test's 400 s (tool demo beside).
    Seed 2 on one thread from that SFT run: +17.2 / +0.25. Thread count and SFT run each draw the
    float sums afresh (the day before, one thread and README's SFT run: +25.0 / +0.22); which of
    code and SFT run moved seed 2 from +25.0 was not separated."""
    def check(seed: int) -> tuple[bool, bool, tuple[float, float]]:
        records = rl_records(countdown_demo_sft, tmp_path, seed, preset="countdown-demo-ppo")
        ev = [r["critic/explained_var"] for r in records if "critic/explained_var" in r]
        assert len(ev) == RL_STEPS
        gain, ev_last = rise(records), statistics.median(ev[-10:])
        return (gain >= MIN_RISE and ev_last >= PPO_MIN_EXPLAINED_VAR,
                gain >= PPO_CLEAR_RISE and ev_last >= PPO_CLEAR_EXPLAINED_VAR, (round(gain, 3), round(ev_last, 3)))

    verdict, seen = seeds_until_decided(check, order=(2, 3, 1))
    assert verdict, seen
