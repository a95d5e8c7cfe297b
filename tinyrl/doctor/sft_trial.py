"""The doctor's trial for an SFT preset (command = "sft"): two real `tinyrl sft` steps at a small
batch, through the real SFTTrainer, in the trial's temporary run directory (trial.run_two_steps,
as the RL trial). Rows:

    two-step run       it ran: the loss of each step, tokens/s (or the error it stopped with)
    CPU load           as the RL trial's
    sleep / wake, rollout parity, adapter sync
                       skipped: an SFT step has no rollout engine
    non-finite grads   optimizer steps skipped because the gradient norm was not finite
    memory: PHASE      measured against the SFT plan (tinyrl.memory.plan.build_plan(sft=True)):
                       on CUDA the allocator's per-phase peaks, on the CPU the trainer's live
                       tensors against the simulation of the same micro-batches (cpu_memory.py)

The SFT trial runs no validation, so its forward phase (the validation loss) is not measured.
"""

from __future__ import annotations

from pathlib import Path

from tinyrl.config import Config
from tinyrl.doctor import trial
from tinyrl.doctor.report import Row, skipped

NO_ENGINE = "an SFT step has no rollout engine"


def sft_trial(cfg: Config, workdir: Path, cuda: bool) -> list[Row]:
    from tinyrl.sft.trainer import SFTTrainer

    ran = trial.run_two_steps(cfg, workdir, cuda, SFTTrainer, "SFT trainer")
    if isinstance(ran, Row):
        return [ran]
    rows = [_run_row(ran), trial.cpu_load_row(ran.trainer.device.type, [h["timing/step"] for h in ran.history],
                                                  ran.trainer.cfg.command)]
    rows += [skipped(name, NO_ENGINE) for name in ("sleep / wake", "rollout parity", "adapter sync")]
    return rows + [trial._nonfinite_row(ran.history), *trial.step_memory_rows(cfg, ran)]


def _run_row(ran: trial.TwoSteps) -> Row:
    trainer, history = ran.trainer, ran.history
    if ran.error is not None:
        row = trial._error_row("two-step run", ran.error, f"stopped after {len(history)} of {trial.STEPS} SFT steps")
        row.data["steps_done"] = len(history)
        return row
    step_s = [h["timing/step"] for h in history]
    found = (f"SFT on {trainer.device.type}, {trial.STEPS} steps of {trainer.cfg.trainer.train_batch_size} rows: "
             f"{' + '.join(f'{s:.1f}' for s in step_s)} s (setup {ran.setup_s:.1f} s); loss "
             f"{', '.join(format(h['sft/loss'], '.3f') for h in history)}; "
             f"{history[-1]['perf/tokens_per_s']:,.0f} tokens/s; data: {ran.data_note}")
    return Row("two-step run", "pass", found, basis="measured",
               data={"device": trainer.device.type, "setup_s": ran.setup_s, "step_s": step_s, "metrics": history})
