"""The turn loop's time split: episodes with the code tool on the HF engine (and vLLM with
--vllm), 16 prompts x n = 1 and 4, <= 120 tokens per episode, on the tiny model taught to call
the tool (the fixture of tests/test_turns_engines.py, ~10 s). Prints per run: episodes, turns,
calls, the wall clock, the time inside engine.generate, the calls' summed seconds (they run
rollout.tool_workers at a time) and the rest (the tool phases' wall clock, rendering, parsing).

    python benchmarks/turn_loop.py [--vllm]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import tinyrl  # noqa: E402,F401  (first: hides the broken torchvision)
import test_turns_engines as T  # noqa: E402  (the taught model and the episode helper)
from tinyrl.rollout.base import SamplingSettings  # noqa: E402
from tinyrl.tiny_model import build_tiny_model  # noqa: E402


def timed(engine, chat, label: str) -> None:
    inside = [0.0]
    real = engine.generate

    def generate(prompts, sampling):
        t = time.perf_counter()
        try:
            return real(prompts, sampling)
        finally:
            inside[0] += time.perf_counter() - t

    engine.generate = generate
    for n in (1, 4):
        inside[0] = 0.0
        t = time.perf_counter()
        res = T._episodes(engine, chat, SamplingSettings(n=n, temperature=1.0, max_new_tokens=120, seed=3))
        wall = time.perf_counter() - t
        calls = [c for e in res.episodes for c in e.tool_calls]
        print(f"{label} n={n}: {len(res.episodes)} episodes, {sum(len(e.turns) for e in res.episodes)} turns, "
              f"{len(calls)} calls ({sum(c.status == 'ok' for c in calls)} ok); wall {wall:.2f} s, generate "
              f"{inside[0]:.2f} s, calls summed {sum(c.seconds for c in calls):.2f} s, rest {wall - inside[0]:.2f} s; "
              f"re-render mismatches {res.tokenization_mismatches}", flush=True)
    engine.generate = real


def main() -> None:
    from tinyrl.rollout.hf_engine import HFEngine

    path = build_tiny_model()
    tok, chat, model = T.taught.__wrapped__(path)
    T.QUESTIONS[:] = [(a, b) for a in range(2, 10) for b in (3, 7)]  # 16 prompts
    timed(HFEngine(model, tok), chat, "hf")
    if "--vllm" in sys.argv:
        from tinyrl.rollout.factory import make_engine

        engine = make_engine("vllm", model=None, tokenizer=tok, model_path=path, dtype="float32", max_model_len=512,
                             max_num_seqs=64, enforce_eager=True, kv_cache_memory_bytes=64 * 2**20)
        engine.sync_weights(model)
        timed(engine, chat, "vllm")
        engine.close()


if __name__ == "__main__":
    main()
