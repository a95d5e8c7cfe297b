"""End to end through the real CLI: PPO with a critic and GRPO each raise the tiny model's mean
reward on a verifiable toy task (a closed answer tag within 32 tokens) from below 0.3 to above
0.8. The reward is a custom one, given with --set reward.fn=file.py:func. Assertions are on the
reward curve in metrics.jsonl, never on time.

Margin (issue 19), measured with torch 2.13 on CPU, the critic adapter training, 32 samples a
step, seeds 1, 2, 3 (step 1 -> mean of the last 10 of 30 steps):
    PPO   0.25 -> 0.91   0.19 -> 0.92   0.12 -> 0.90
    GRPO  0.19 -> 0.89   0.19 -> 0.95   0.19 -> 0.94
Thresholds 0.3 and 0.8. Step 1 is the base model's rate (0.20 over 256 samples); every curve is
near its ~0.9 plateau by step 12, so 18+ steps on the plateau give a 10-step mean whose spread
(~0.02) is a quarter of its 0.085 margin. Before (20 steps, the last 5): PPO ended 0.85 on
seed 2, and failed once on a busy machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import machine_threads_env

TOY = Path(__file__).parent / "helpers" / "toy_reward.py"
STEPS, LAST = 30, 10
COMMON = ["rollout.max_response_length=32", "actor.lr=1e-3", f"trainer.max_steps={STEPS}", "trainer.test_every=0",
          "trainer.save_every=0", f"reward.fn={TOY}:closed_answer", "data.generate_train_size=2048",
          "trainer.seed=1", "trainer.device=cpu"]  # the CPU path, on a CUDA machine too
ALGOS = {
    "ppo": ["algorithm.adv_estimator=gae"],
    "grpo": ["algorithm.adv_estimator=grpo", "rollout.n=4", "trainer.train_batch_size=8",
             "actor.ppo_mini_batch_size=4", "algorithm.kl_in_reward=false", "algorithm.use_kl_loss=true"],
}


def train(tmp_path: Path, overrides: list[str], data: Path) -> list[dict]:
    run = tmp_path / "run"
    args = [sys.executable, "-m", "tinyrl.cli", "train", "--preset", "countdown-tiny", "--out", str(run),
            "--no-dashboard", "--set", f"data.train_path={data}"]
    for item in COMMON + overrides:
        args += ["--set", item]
    done = subprocess.run(args, capture_output=True, text=True, timeout=1200, env=machine_threads_env())  # as measured
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"step {STEPS}/{STEPS}" in done.stdout  # the plain dashboard line of the last step
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_rl_raises_the_toy_reward(tmp_path, tiny_model_dir, algo, countdown_train):
    history = train(tmp_path, ALGOS[algo], countdown_train(2048))
    rewards = [m["reward/mean"] for m in history]
    assert len(rewards) == STEPS
    assert rewards[0] < 0.3, rewards
    assert sum(rewards[-LAST:]) / LAST > 0.8, rewards
    if algo == "ppo":
        assert "critic/vf_loss" in history[-1]
    else:
        assert "critic/vf_loss" not in history[-1] and "actor/kl_loss" in history[-1]
