"""The CPU tool demo: `tinyrl sft --preset countdown-tools-demo-sft`, then `tinyrl train --preset
countdown-tools-demo` (episodes with the Python tool) from that one SFT run on several RL seeds.
The slow test's margins are in its docstring; the fast tests check what its figures are made of.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest

from tinyrl import jsonl
from tinyrl.rollout.base import Episode, ToolCall, Turn

SEEDS = (1, 2, 3)
MIN_RISE = 0.10
MIN_SEEDS_RISING = 2


def _episode(*statuses: str) -> Episode:
    return Episode(0, [1], [2], [1], None, [Turn("assistant", 0, 1)], "stop",
                   [ToolCall("code_interpreter", s, 0.1, 0) for s in statuses])


def test_tool_ok_share_counts_episodes_with_a_call_that_ran_and_exited_0():
    from tinyrl.rollout.turns import tool_ok_share

    episodes = [_episode(), _episode("ok"), _episode("error", "ok"), _episode("error"), _episode("timeout"),
                _episode("bad_call"), _episode("ok", "ok"), _episode("over_limit")]
    assert tool_ok_share(episodes) == 3 / 8  # episodes, not calls: ("ok", "ok") is one
    assert tool_ok_share([]) == 0.0


def test_the_end_of_run_line_shows_tool_use_before_and_after():
    from tinyrl.report import accuracy_change

    recs = [{"step": 0, "val/score": 0.1, "val/tools/ok_share": 0.25}, {"step": 5, "reward/mean": 0.3},
            {"step": 10, "val/score": 0.4, "val/tools/ok_share": 0.875}]
    line = accuracy_change(recs, 128)
    assert "10.0% before training -> 40.0% after step 10 (+30.0 points)" in line
    assert line.endswith("successful tool call (val/tools/ok_share), same prompts: 25.0% before training -> "
                         "87.5% after step 10")
    assert "tool call" not in accuracy_change([{k: v for k, v in r.items() if "tools" not in k} for r in recs])


def cli(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "tinyrl.cli", *args], capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="session")
def tool_sft_run(tmp_path_factory, tiny_model_dir) -> Path:
    """The preset's SFT run on the data its first use generates, made ONCE for all pytest-xdist
    workers: under a file lock in the directory the workers' temp dirs share (xdist's
    loadgroup does not group tests across workers here, pytest 9.2 + xdist 3.8)."""
    root = tmp_path_factory.getbasetemp().parent / "tool-demo"
    root.mkdir(exist_ok=True)
    run, done_marker = root / "sft", root / "sft.done"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done_marker.exists():
            cli("data", "arith", "--out", str(root / "data"), "--train-size", "8192", "--test-size", "1024", "--sft")
            cli("sft", "--preset", "countdown-tools-demo-sft", "--out", str(run), "--no-dashboard",
                "--set", f"data.train_path={root / 'data' / 'sft_train.parquet'}")
            done_marker.write_text("ok")
    return run


def rl_run(sft_run: Path, run: Path, *extra: str) -> tuple[list[dict], str]:
    done = cli("train", "--preset", "countdown-tools-demo", "--out", str(run), "--no-dashboard",
               "--set", f"model.init_from={sft_run}",
               "--set", f"data.train_path={sft_run.parent / 'data' / 'train.parquet'}", *extra)
    return jsonl.read_records(run / "metrics.jsonl"), done.stdout
