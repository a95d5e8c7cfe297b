"""SFT, then RL, through the real CLI (issue 14): `tinyrl data countdown --sft`, `tinyrl sft`
(single-turn, SIGTERM then --resume, multi-turn with a custom chat template), `tinyrl train --set
model.init_from=...`, `tinyrl export` and `tinyrl report` of the runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from tinyrl import jsonl

ENV = {**os.environ, "COLUMNS": "200"}


def tinyrl(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", *args], capture_output=True, text=True,
                          timeout=600, env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


@pytest.mark.slow
def test_sft_then_rl_through_the_cli(tmp_path):
    from test_sft import TEMPLATE, multiturn_file

    data = tmp_path / "data"
    tinyrl("data", "countdown", "--out", str(data), "--train-size", "64", "--test-size", "16", "--sft")
    assert pq.read_table(data / "sft_train.parquet").column("response").length() == 64
    common = sets("trainer.train_batch_size=8", "trainer.device=cpu", "trainer.save_every=1", "actor.lr=1e-2")
    sft_run = tmp_path / "sft"
    sft_args = ["sft", "--preset", "countdown-tiny-sft", "--out", str(sft_run), "--no-dashboard", *common,
                *sets(f"data.train_path={data / 'sft_train.parquet'}", f"data.test_path={data / 'sft_test.parquet'}",
                      "trainer.test_every=2")]
    # SIGTERM mid-run: it stops cleanly with a checkpoint and says how to resume (as `train` does)
    proc = subprocess.Popen([sys.executable, "-m", "tinyrl.cli", *sft_args, "--max-steps", "500"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.monotonic() + 300
    while not (sft_run / "metrics.jsonl").is_file() or not jsonl.read_records(sft_run / "metrics.jsonl"):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, out + err
    assert "resume with: tinyrl sft --preset countdown-tiny-sft" in " ".join((out + err).split())
    stopped = jsonl.read_records(sft_run / "metrics.jsonl")[-1]["step"]
    resumed = tinyrl(*sft_args, "--max-steps", str(stopped + 2), "--resume")
    metrics = jsonl.read_records(sft_run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, stopped + 3)) and "val/loss" in metrics[1]
    last = metrics[-1] if "val/score" in metrics[-1] else metrics[-2]  # validated every 2 steps
    # the end says the last validation in words (it was only in the dashboard's last frame)
    assert f"greedy accuracy (val/score) on 16 held-back test prompts: {last['val/score']:.1%} at step " \
           f"{last['step']}" in resumed.stdout, resumed.stdout[-600:]

    chat = multiturn_file(tmp_path / "chat.parquet", rows=8)
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    tinyrl("sft", "--preset", "countdown-tiny-sft", "--out", str(tmp_path / "chat"), "--no-dashboard",
           "--max-steps", "1",
           *common, *sets(f"data.train_path={chat}", "trainer.test_every=0", f"model.custom_chat_template={template}"))
    assert jsonl.read_records(tmp_path / "chat" / "metrics.jsonl")[0]["sft/loss"] > 0

    rl_run = tmp_path / "rl"
    tinyrl("train", "--preset", "countdown-tiny", "--out", str(rl_run), "--no-dashboard", "--max-steps", "1", *common,
           *sets("actor.ppo_mini_batch_size=8", "trainer.test_every=0", f"data.train_path={data / 'train.parquet'}",
                 f"model.init_from={sft_run}", "rollout.max_response_length=16"))
    first = jsonl.read_records(rl_run / "metrics.jsonl")[0]
    assert abs(first["kl/mean"]) < 1e-6  # the actor starts AS the reference: both are the SFT model
    made_from = json.loads((rl_run / "init_model" / "tinyrl_export.json").read_text())
    assert made_from["step"] == stopped + 2

    for run in (sft_run, rl_run):
        tinyrl("export", str(run), "--out", str(tmp_path / f"export-{run.name}"))
        assert (tmp_path / f"export-{run.name}" / "model.safetensors").is_file()
    report = tinyrl("report", str(sft_run)).stdout
    assert "sft_loss.png" in report and "final val loss" in report
