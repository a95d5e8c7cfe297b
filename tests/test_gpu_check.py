"""benchmarks/gpu_check.py, the one-command GPU check of issue 20: here (no CUDA) its reduced CPU
path must run end to end through the real Trainer and print every check's row; on a CUDA machine
the same test runs the card path on a small setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--steps", "2", "--set", "trainer.train_batch_size=4", "--set", "rollout.max_response_length=16",
         "--set", "actor.ppo_mini_batch_size=0", "--set", "critic.ppo_mini_batch_size=0"]


def test_gpu_check_runs_and_reports_every_check(tmp_path):
    extra = ["--preset", "countdown-0.5b-4090", "--skip-probe"] if torch.cuda.is_available() else []
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *SMALL, *extra],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    for words in ("2 PPO steps", "actor_update", "critic_update", "rollout", "engine decode:",
                  "critic adapter trained: yes", "actor/skipped_steps 0", "all checks passed"):
        assert words in out, f"{words!r} missing from:\n{out}"
    if not torch.cuda.is_available():
        assert "no CUDA card: the reduced CPU check" in out
    assert not list(tmp_path.iterdir())  # nothing left behind in the working directory
