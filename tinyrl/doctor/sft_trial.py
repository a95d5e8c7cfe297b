"""The doctor's trial for an SFT preset (command = "sft"): two real `tinyrl sft` steps at a small
batch, through the real SFTTrainer, in the trial's temporary run directory. Rows:

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

import time
from pathlib import Path

from tinyrl.config import Config, resolve_path
from tinyrl.doctor.report import Row, skipped
from tinyrl.errors import TinyRLError

NO_ENGINE = "an SFT step has no rollout engine"


def ensure_sft_data(cfg: Config, workdir: Path, rows: int = 64) -> str:
    """The preset's SFT file when it exists; else a small one generated into `workdir` (the doctor
    writes nothing outside its temporary directory). -> where the data came from"""
    if resolve_path(cfg.data.train_path).exists():
        return cfg.data.train_path
    from tinyrl.tasks import data_hint, get_task, template_of

    task = get_task(cfg.task.name)
    if task.generate_sft is None:
        raise TinyRLError(f"data.train_path = {cfg.data.train_path} does not exist and the {task.name} task "
                          "does not generate SFT data", hint=f"make it first: {data_hint(cfg)}")
    train, _ = task.generate_sft(workdir / "data", rows, 16, seed=cfg.data.generate_seed,
                                 template=template_of(cfg.task), progress=False, **task.generate_options(cfg.task))
    missing, cfg.data.train_path = cfg.data.train_path, str(train)
    return f"{rows} rows generated for the check ({missing} does not exist yet)"


def sft_trial(cfg: Config, workdir: Path, cuda: bool, steps: int) -> list[Row]:
    from tinyrl.doctor import trial

    run_dir = workdir / "run"
    try:
        data_note = ensure_sft_data(cfg, workdir)
        from tinyrl.preflight import preflight

        preflight(cfg, run_dir)  # as `tinyrl sft`: on CUDA the SFT plan fills the micro-batch budgets
    except TinyRLError as exc:
        return [Row("two-step run", "fail", f"not started: {exc.message}", fix=exc.hint, basis="measured")]
    from tinyrl.doctor.cpu_memory import TensorPeaks, cpu_memory_rows, measuring
    from tinyrl.sft.trainer import SFTTrainer

    peaks = None if cuda else TensorPeaks()
    started = time.perf_counter()
    trainer, history, error, setup_s = None, [], None, 0.0
    try:
        trainer = SFTTrainer(cfg, run_dir)
        setup_s = time.perf_counter() - started
        if peaks is not None:
            peaks.attach(trainer)
        with measuring(peaks):
            history = trainer.train(steps)
    except Exception as exc:  # noqa: BLE001  (any failure is the finding; the doctor goes on)
        error = exc
    if trainer is None:
        return [trial._error_row("two-step run", error, "the SFT trainer could not be built")]
    rows = [_run_row(trainer, history, error, steps, setup_s, data_note),
            trial.cpu_load_row(trainer.device.type, [h["timing/step"] for h in history])]
    rows += [skipped(name, NO_ENGINE) for name in ("sleep / wake", "rollout parity", "adapter sync")]
    rows.append(trial._nonfinite_row(history))
    if peaks is None:
        rows += trial.memory_rows(cfg, run_dir)
    else:
        rows += cpu_memory_rows(cfg, peaks, trial._dtype_name(trainer.models.dtype))
    return rows


def _run_row(trainer, history: list[dict], error, steps: int, setup_s: float, data_note: str) -> Row:
    from tinyrl.doctor import trial

    if error is not None:
        row = trial._error_row("two-step run", error, f"stopped after {len(history)} of {steps} SFT steps")
        row.data["steps_done"] = len(history)
        return row
    step_s = [h["timing/step"] for h in history]
    found = (f"SFT on {trainer.device.type}, {steps} steps of {trainer.cfg.trainer.train_batch_size} rows: "
             f"{' + '.join(f'{s:.1f}' for s in step_s)} s (setup {setup_s:.1f} s); loss "
             f"{', '.join(format(h['sft/loss'], '.3f') for h in history)}; "
             f"{history[-1]['perf/tokens_per_s']:,.0f} tokens/s; data: {data_note}")
    return Row("two-step run", "pass", found, basis="measured",
               data={"device": trainer.device.type, "setup_s": setup_s, "step_s": step_s, "metrics": history})
