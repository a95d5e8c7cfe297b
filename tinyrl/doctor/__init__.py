"""`tinyrl doctor`: this machine checked, row by row, then a two-step real run of a preset.

Rows (tinyrl.doctor.report.Row): name, status (pass / fail / warn / skipped), what was found,
a fix for each failure, and the basis of the figure: "measured" on this machine, "simulated"
(the memory plan's fake-tensor trace), "read" (versions read from this install), or none for a
skipped row. Sections:

    environment   Python, torch (build, CUDA, card and its arch vs the build, driver), vLLM and
                  bitsandbytes vs tinyrl's own pins, whether tinyrl has run these torch and
                  transformers versions (exercised.py), free disk for the run dir, RAM   (env.py)
    trial         two real training steps of the preset at a small batch, in a temporary run
                  dir, with the configured engine: sleep/wake timings, the parity check, an
                  explicit adapter-sync check, measured peak memory per phase vs the plan (trial.py);
                  an SFT preset's two `tinyrl sft` steps against its SFT plan (sft_trial.py)
    bench         (--bench) a few steps of `tinyrl train` (or `sft`) at the planned settings in a
                  child process: seconds per phase, tokens/s, and estimate-cost from them (bench.py)

Exit codes: 0 every row passed (warnings and skipped rows included), 1 a row failed,
2 bad input (an unknown preset, a bad --set), as every tinyrl command; 130/143 stopped by Ctrl-C
or SIGTERM, at once, wherever it was (the trial trains under tinyrl.interrupts.throwaway: no
graceful stop), its temporary directories removed and the bench's child killed.
"""

from __future__ import annotations

from tinyrl.contention import usable_cpus
from tinyrl.doctor.report import Report, Row

EXIT_OK, EXIT_FAILED = 0, 1


def run_doctor(preset: str, overrides: list[str] | None = None, *, bench: bool = False,
               bench_steps: int = 3, progress=None) -> Report:
    """All the checks; never raises for a failed check (that is a row), only for bad input (and
    tinyrl.interrupts.Interrupted on a signal under the CLI: the trial's and the bench's temporary
    directories removed). progress(message): what it is doing now, "running ..." while a trial or
    a bench run is on disk."""
    import platform
    import sys

    from tinyrl.config import load_config
    from tinyrl.doctor import env, trial

    say = progress or (lambda message: None)
    cfg = load_config(preset, overrides)  # bad input: TinyRLError, exit 2, before anything runs
    report = Report(preset=cfg.preset_arg, overrides=list(overrides or []),
                    machine={"platform": platform.platform(), "python": sys.version.split()[0],
                             "cpus": usable_cpus()})
    say("checking the install, the card, the disk and the memory ...")
    report.rows += env.environment_rows(cfg)
    import torch

    if torch.cuda.is_available() and cfg.trainer.device == "cpu":
        report.rows.append(Row("device", "warn", f"preset {cfg.preset} pins trainer.device = cpu: the trial below "
                               "does not use the card", fix="--set trainer.device=cuda, or a card preset such as "
                               "--preset countdown-4090", basis="read"))
    what = "SFT, no engine" if cfg.command == "sft" else f"engine {cfg.rollout.engine}"
    say(f"running two real steps of {cfg.preset} ({cfg.model.name}, {what}) at a small batch ...")
    report.rows += trial.trial_rows(preset, overrides, report)
    if bench:
        from tinyrl.doctor import bench as bench_mod

        say(f"running the bench: {bench_steps} steps of `tinyrl {cfg.command} --preset {cfg.preset_arg}` at its planned settings ...")
        report.rows += bench_mod.bench_rows(preset, overrides, bench_steps, report)
    return report
