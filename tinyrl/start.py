"""Starting a run, one sequence for `tinyrl train`/`sft` (tinyrl.cli.run) and benchmarks/gpu_check.py:
preflight (on a card the memory plan fills the micro-batch budgets left at 0), the trainer, then
the plan kept beside the run (RUN_DIR/memory_plan.json: the dashboard's, the report's and
gpu_check's plan columns read it). Each caller had its own copy until 2026-11-30, and the
benchmark's drifted: it kept no plan, so its plan-vs-peak rows were blank on the H200 (2026-11-29).

The caller holds `rundir.claim(run_dir, ...)`: a user's reward worker opens
RUN_DIR/reward_prints.log while the trainer is built, and the claim is what makes the directory.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tinyrl.config import Config


@dataclass
class Started:
    """A run ready for its first step."""

    trainer: Any                   # tinyrl.trainer.Trainer, or tinyrl.sft.trainer.SFTTrainer for `sft`
    algorithm: str                 # "sft", or the estimator (algorithm.adv_estimator)
    engine: str                    # the rollout engine's name; "none" for `sft`
    notes: list[str] = field(default_factory=list)  # preflight's, worth showing at the start


def start_run(cfg: Config, run_dir: Path, *, resume: bool = False, command: str = "train",
              working: Callable[[str], AbstractContextManager] = lambda text: nullcontext()) -> Started:
    """The checks, the trainer, the plan on disk. `working(text)` wraps each slow part (the CLI's
    spinner). The plan is written only once the trainer is built: a start refused by a later input
    check (prompts longer than data.max_prompt_length, a reward's own check) leaves no plan behind."""
    import torch

    from tinyrl import preflight as pf  # looked up at the call: tests replace preflight.preflight
    from tinyrl.memory.versus import write_run_plan

    on_card = cfg.trainer.device != "cpu" and torch.cuda.is_available()  # a CPU run has no card or plan to check
    with working("checking the card, the disk and the memory plan ..." if on_card else "checking the disk and RAM ..."):
        checked = pf.preflight(cfg, run_dir)  # fills 0 settings from the plan before config.json is written
    if command == "sft":
        from tinyrl.sft.trainer import SFTTrainer

        with working(f"preparing {cfg.preset}: model {cfg.model.name}, SFT data ..."):
            trainer = SFTTrainer(cfg, run_dir, resume=resume)
        algorithm, engine = "sft", "none"
    else:
        from tinyrl.trainer import Trainer

        with working(f"preparing {cfg.preset}: model {cfg.model.name}, data, reward, rollout engine ..."):
            trainer = Trainer(cfg, run_dir, resume=resume)
        algorithm, engine = cfg.algorithm.adv_estimator, trainer.engine.name
    if checked.run_plan is not None:
        write_run_plan(run_dir, checked.run_plan)
    return Started(trainer, algorithm, engine, checked.notes)
