"""The turn loop's time split: episodes with the code tool on the HF engine (and vLLM with
--vllm), 16 prompts x n = 1 and 4, <= 120 tokens per episode, on the tiny model taught to call
the tool (the fixture of tests/test_turns_engines.py, ~10 s). Prints per run: episodes, turns,
calls, the wall clock, the time inside the engine's generate, the calls' summed seconds (they
run rollout.tool_workers at a time), the rest (the tool phases' wall clock, rendering, parsing)
and the real tokens prefilled per episode (a prompt counts once for its n samples).

--cache picks the HF engine's path across turns: `kept` (its KV cache kept, only the added
tokens prefilled; the default), `reprefill` (each turn re-prefills the whole context), `both`.

--slow-tool S: every 5th tool call sleeps S seconds first (a slow call among fast ones).
--tool-workers N: rollout.tool_workers (default 0: the usable cores); a slow call that only
waits (a remote sandbox) should not hold a worker a fast call needs.
--sync: no next turn starts before ALL pending calls are back (the loop before the overlap,
emulated by replacing turns._wait_until_one_ready and turns._ready), to compare wall clocks on the same
episodes.

    python benchmarks/turn_loop.py [--cache kept|reprefill|both] [--vllm] [--slow-tool S] [--tool-workers N]
                                  [--sync]
"""
from __future__ import annotations

import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import tinyrl  # noqa: E402,F401  (first: hides the broken torchvision)
import test_turns_engines as T  # noqa: E402  (the taught model and the episode helper)
from tinyrl.rollout.base import SamplingSettings  # noqa: E402
from tinyrl.tiny_model import build_tiny_model  # noqa: E402


class Timed:
    """Wraps what the turn loop generates through (the engine, or its episode session): the
    seconds inside generate, and the real tokens prefilled (a prompt once for its n samples)."""

    def __init__(self, inner) -> None:
        self.inner, self.seconds, self.prefilled = inner, 0.0, 0

    def generate(self, contexts, sampling, *keys):
        t = time.perf_counter()
        prefilled = getattr(self.inner, "prefilled", None)
        try:
            return self.inner.generate(contexts, sampling, *keys)
        finally:
            self.seconds += time.perf_counter() - t
            self.prefilled += (self.inner.prefilled - prefilled if prefilled is not None
                               else sum(map(len, contexts)))  # engine.generate: every context whole

    def step(self):  # a stepping session (vLLM): its later turns run here, not in generate
        t = time.perf_counter()
        try:
            return self.inner.step()
        finally:
            self.seconds += time.perf_counter() - t

    def submit(self, key, context, sampling):  # its whole context goes in (vLLM's prefix cache serves its blocks)
        self.prefilled += len(context)
        return self.inner.submit(key, context, sampling)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def timed(engine, chat, label: str) -> None:
    for n in (1, 4):
        session = engine.episode_session() if hasattr(engine, "episode_session") else None
        wrapped = Timed(session or engine)
        runs = (lambda: wrapped) if session is not None else None
        target = Timed(engine) if session is not None else wrapped
        if runs is not None:
            target.episode_session = runs
        t = time.perf_counter()
        res = T._episodes(target, chat, SamplingSettings(n=n, temperature=1.0, max_new_tokens=120, seed=3))
        wall = time.perf_counter() - t
        calls = [c for e in res.episodes for c in e.tool_calls]
        print(f"{label} n={n}: {len(res.episodes)} episodes, {sum(len(e.turns) for e in res.episodes)} turns, "
              f"{len(calls)} calls ({sum(c.status == 'ok' for c in calls)} ok); wall {wall:.2f} s, generate "
              f"{wrapped.seconds:.2f} s, calls summed {sum(c.seconds for c in calls):.2f} s, rest "
              f"{wall - wrapped.seconds:.2f} s; prefilled (vllm: submitted) {wrapped.prefilled / len(res.episodes):.1f} tokens per "
              f"episode; re-render mismatches {sum(e.rerender != 'same' for e in res.episodes)} "
              f"({sum(e.rerender == 'text' for e in res.episodes)} in text); episodes' digest "
              f"{zlib.crc32(repr([e.response_ids for e in res.episodes]).encode()):08x}", flush=True)


def main() -> None:
    from tinyrl.rollout.hf_engine import HFEngine

    path = build_tiny_model()
    tok, chat, model = T.taught.__wrapped__(path)
    T.QUESTIONS[:] = [(a, b) for a in range(2, 10) for b in (3, 7)]  # 16 prompts
    if "--slow-tool" in sys.argv:
        T.CODE = T._delayed([0.0] * 4 + [float(sys.argv[sys.argv.index("--slow-tool") + 1])])
    if "--tool-workers" in sys.argv:
        import functools

        T.EpisodeLimits = functools.partial(T.EpisodeLimits, tool_workers=int(sys.argv[sys.argv.index("--tool-workers") + 1]))
    if "--sync" in sys.argv:
        import tinyrl.rollout.turns as turns

        ready = turns._ready
        turns._wait_until_one_ready = turns._wait_all
        turns._ready = lambda pending: (lambda r: r if len(r) == len(pending) else [])(ready(pending))  # vLLM's steps
    cache = sys.argv[sys.argv.index("--cache") + 1] if "--cache" in sys.argv else "kept"
    for keep in {"kept": [True], "reprefill": [False], "both": [True, False]}[cache]:
        engine = HFEngine(model, tok, keep_context_cache=keep)
        timed(engine, chat, "hf, kept cache" if engine.keeps_context_cache else "hf, re-prefill")
    if "--vllm" in sys.argv:
        from tinyrl.rollout.factory import make_engine

        engine = make_engine("vllm", model=None, tokenizer=tok, model_path=path, dtype="float32", max_model_len=512,
                             max_num_seqs=64, enforce_eager=True, kv_cache_memory_bytes=64 * 2**20)
        engine.sync_weights(model)
        timed(engine, chat, "vllm")
        engine.close()


if __name__ == "__main__":
    main()
