"""README's first command: `tinyrl sft --preset countdown-demo-sft`, then `tinyrl train --preset
countdown-demo` from that one SFT run on two RL seeds. RL must raise the greedy accuracy on the
same 256 held-back tasks (val/score at step 0, trainer.val_before_train, against the last step).
Assertions are on metrics.jsonl, never on time. Not shortened: 300 SFT steps are what it takes
for the tiny model to copy the numbers at all (200 steps: 3.9%), and 60 RL steps is the preset.

Margin, measured after GRPO's shared prompts were packed once (quiet 2-core machine, the same
commands, data and seeds): SFT 8.6% on the 256 tasks; after 60 GRPO steps, seed 1: 24.6%
(+16.0 points), seed 2: 26.6% (+18.0). Before that change, with the same math summed in another
order: +22.3, +19.9, +19.9 (seeds 1-3). Each seed must rise by at least 10 points (26 of 256
tasks), 6 points (15 tasks) below the smallest rise measured. Two seeds keep CI's time down.
The SFT end point is sensitive to floating-point order (the padded layout of the same 300 steps
ends at 21.5%, and RL then rose +2.0 to +11.3 points), so this test pins the real preset through
the real CLI rather than hand-picked numbers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tinyrl import jsonl

RL_STEPS = 60
SEEDS = (1, 2)
MIN_RISE = 0.10  # measured +0.160 and +0.180 (module docstring)


def cli(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", *args], capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, tiny_model_dir) -> Path:
    """The preset's SFT run, on the data its first use generates (same seed and options)."""
    tmp = tmp_path_factory.mktemp("demo")
    cli("data", "countdown", "--out", str(tmp / "data"), "--train-size", "8192", "--test-size", "1024",
        "--operands", "2", "--max-number", "50", "--sft")
    run = tmp / "sft"
    cli("sft", "--preset", "countdown-demo-sft", "--out", str(run), "--no-dashboard",
        "--set", f"data.train_path={tmp / 'data' / 'sft_train.parquet'}")
    return run


def rise(sft_run: Path, tmp_path: Path, seed: int) -> float:
    run = tmp_path / f"rl-{seed}"
    done = cli("train", "--preset", "countdown-demo", "--out", str(run), "--no-dashboard",
               "--max-steps", str(RL_STEPS), "--set", f"model.init_from={sft_run}", "--set", f"trainer.seed={seed}",
               "--set", f"data.train_path={sft_run.parent / 'data' / 'train.parquet'}")
    records = jsonl.read_records(run / "metrics.jsonl")
    before = records[0]
    after = [r for r in records if "val/score" in r][-1]
    assert before["step"] == 0 and after["step"] == RL_STEPS
    assert "before training ->" in done.stdout and "256 held-back test prompts" in done.stdout
    return after["val/score"] - before["val/score"]


@pytest.mark.slow
# pytest-timeout's 1,500 s (pyproject.toml) counts the SFT fixture too: 8,192 rows, 300 SFT steps
# and two 60-step RL runs with 256-task validations took 100 s (setup) + 376 s (call) = 476 s in
# a full-suite run on the shared 2-core machine (session 3 baseline), so a 3x slower, busy
# machine (issue 19's run 1 was 2.6x) would come within a few percent of 1,500 s and be stopped
# while healthy. 3,600 s is 7.6x that run: it still only catches a hang.
@pytest.mark.timeout(3600)
def test_rl_raises_greedy_accuracy_on_held_back_tasks(sft_run, tmp_path):
    rises = [rise(sft_run, tmp_path, seed) for seed in SEEDS]
    assert min(rises) >= MIN_RISE, rises
