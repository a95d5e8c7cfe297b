"""Kill -9 in the middle of training, --resume, and end exactly where an uninterrupted run ends:
same prompts in the same order (per-step digests) and the same trained weights (to 1e-5)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tinyrl import checkpoint as ckpt

STEPS = 6


def command(data: Path, out: Path, *extra: str) -> list[str]:
    sets = [f"data.train_path={data}",
            "trainer.train_batch_size=8", "actor.ppo_mini_batch_size=4", "rollout.max_response_length=24",
            "trainer.save_every=2", "trainer.test_every=3", "data.max_test_prompts=8"]
    args = [sys.executable, "-m", "tinyrl.cli", "train", "--preset", "countdown-tiny", "--out", str(out),
            "--max-steps", str(STEPS), "--no-dashboard", *extra]
    for item in sets:
        args += ["--set", item]
    return args


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path, tiny_model_dir, countdown_train):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    data = countdown_train(256)
    done = subprocess.run(command(data, straight), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    proc = subprocess.Popen(command(data, killed), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    target = killed / "checkpoints" / "step_0000004" / "state.pt"
    deadline = time.monotonic() + 600
    while not target.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)  # mid-training: step 5 is under way
    proc.wait()
    assert len(metrics(killed)) < STEPS

    resumed = subprocess.run(command(data, killed, "--resume"), capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 4" in resumed.stdout

    a, b = metrics(straight), metrics(killed)
    assert [m["step"] for m in b] == list(range(1, STEPS + 1))
    assert [m["data/rows_sha1"] for m in a] == [m["data/rows_sha1"] for m in b]
    assert [m.get("val/score") for m in a] == [m.get("val/score") for m in b]
    final_a = ckpt.load_latest(straight / "checkpoints")
    final_b = ckpt.load_latest(killed / "checkpoints")
    assert final_a["step"] == final_b["step"] == STEPS
    for part in ("actor", "critic", "value_head"):
        for name, tensor in final_a["models"][part].items():
            torch.testing.assert_close(final_b["models"][part][name], tensor, atol=1e-5, rtol=0)
    moved = final_a["models"]["actor"]
    assert any(t.abs().sum() > 0 for n, t in moved.items() if "lora_B" in n)  # training really changed weights
