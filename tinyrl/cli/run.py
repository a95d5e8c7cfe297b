"""`tinyrl train` and `tinyrl sft`: the same checks, run directory, dashboard and endings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from tinyrl.cli.common import (MaxStepsOpt, NoDashboardOpt, ResumeOpt, RunDirOpt, RunPresetOpt, SetOpt, app, err,
                               log_to_stderr, out, said_if_stopped, typed, working)
from tinyrl.errors import TinyRLError


def _train_help() -> str:
    """`tinyrl train --help`: the estimators from their one table (tinyrl.roles, torch-free)."""
    from tinyrl.roles import ESTIMATORS

    names = ", ".join(f"{name} (PPO with a critic)" if e.critic else name for name, e in ESTIMATORS.items())
    return ("Train with RL (PPO with a critic, GRPO, ...): rollout, reward, log-probs, advantages, updates, sync.\n\n"
            f"The algorithm is the preset's algorithm.adv_estimator: {names}; change it and any other "
            "setting with --set key.sub=value (e.g. --set algorithm.adv_estimator=grpo --set rollout.n=8). "
            "`tinyrl presets show NAME` prints every key and its value.\n\n"
            "Writes RUN_DIR/config.json, metrics.jsonl (+ .parquet), samples.jsonl, timeline.jsonl and "
            "checkpoints/. Kill it any time; --resume continues at the same step with the same data. "
            "Start from an SFT run with --set model.init_from=RUN_DIR (it is the reference too).\n\n"
            "Example (the CPU demo's RL step): tinyrl train --preset countdown-demo --set trainer.seed=2 "
            "--out runs/seed2\n\n"
            "Example (continue it after a stop): tinyrl train --out runs/seed2 --resume")


@app.command(help=_train_help())
def train(
    preset: Optional[str] = RunPresetOpt,
    overrides: Optional[list[str]] = SetOpt,
    out_dir: Optional[Path] = RunDirOpt,
    max_steps: Optional[int] = MaxStepsOpt,
    resume: bool = ResumeOpt,
    no_dashboard: bool = NoDashboardOpt,
) -> None:
    """RL on a preset (help: _train_help)."""
    _run_command("train", preset, typed(overrides), out_dir, max_steps, resume, no_dashboard)


@app.command()
def sft(
    preset: Optional[str] = RunPresetOpt,
    overrides: Optional[list[str]] = SetOpt,
    out_dir: Optional[Path] = RunDirOpt,
    max_steps: Optional[int] = MaxStepsOpt,
    resume: bool = ResumeOpt,
    no_dashboard: bool = NoDashboardOpt,
) -> None:
    """Supervised fine-tuning on parquet in verl's SFT formats: prompt/response columns, or
    multi-turn `messages` (loss on assistant turns only, `tools` handed to the chat template).

    An SFT preset (command = "sft"): probe-memory, estimate-cost and doctor of it plan, price and try this step.

    The same loop, checkpoints, --resume, dashboard, metrics and `tinyrl report` as `train`
    (train/val loss, every trainer.test_every steps on data.test_path). Then RL from it:
    `tinyrl train --preset P --set model.init_from=RUN_DIR`; `tinyrl export RUN_DIR` merges it.

    Example (your own file): tinyrl sft --preset countdown-tiny-sft --out runs/my-sft
    --set data.train_path=mine.parquet --set data.test_path=mine_test.parquet
    --set sft.val_generate=false
    """
    _run_command("sft", preset, typed(overrides), out_dir, max_steps, resume, no_dashboard)


def _run_command(command: str, preset: Optional[str], overrides: Optional[list[str]], out_dir: Optional[Path],
                 max_steps: Optional[int], resume: bool, no_dashboard: bool) -> None:
    """`train` and `sft`: the same checks, loop and endings; only the trainer differs."""
    from tinyrl import rundir
    from tinyrl.config import TypedSets, set_key

    config_notes: list[str] = []
    run_dir = resume_cmd = None
    if preset is None:  # `--out RUN_DIR --resume`: the preset and --set options the run keeps
        if not (resume and out_dir is not None):
            raise TinyRLError("--preset is needed", hint=f"e.g. tinyrl {command} --preset countdown-tiny (`tinyrl "
                              "presets` lists them); to continue a run: --out RUN_DIR --resume")
        preset, kept = rundir.resumed_args(out_dir)
        given = {set_key(item) for item in overrides or []}  # a --set given now replaces the kept one
        overrides = TypedSets([item for item in kept if set_key(item) not in given] + list(overrides or []))

    def said() -> str:  # asked when the signal comes: what was under way, what to do
        if resume_cmd is None:
            return " while reading the config and the data; nothing was written"
        again = resume_cmd if (run_dir / "config.json").exists() else "the same command"
        return f" before training began; nothing to save. Start again with: {again}"

    # Ctrl-C/SIGTERM end cleanly from the start (tinyrl.interrupts); until 2026-11-27 one while the
    # config and the data were read (seconds on a large parquet) printed a traceback.
    with said_if_stopped(said):
        cfg, run_dir, resume_cmd = _checked_run(command, preset, overrides, out_dir, max_steps, resume, config_notes)
        # The run directory's owner until this command ends (a second process: exit 2 with this
        # pid); taken before anything is written into it, and before looking at what it holds.
        with rundir.claim(run_dir, command):
            if not resume:
                rundir.check_new_run(run_dir)  # another run's metrics or checkpoints: --resume or another --out
            _train(cfg, run_dir, resume, max_steps, no_dashboard, resume_cmd, command, config_notes)


def _checked_run(command: str, preset: str, overrides: Optional[list[str]], out_dir: Optional[Path],
                 max_steps: Optional[int], resume: bool, config_notes: list[str]):
    """The config and the data checked, nothing written -> (cfg, run_dir, resume_cmd)."""
    from tinyrl import rundir
    from tinyrl.config import check_command, load_config
    from tinyrl.setup import (check_data_rows, check_train_path, held_out_note, kept_as_it_is_note,
                              settle_train_path)

    if resume and out_dir is not None:  # its relative paths start where it started: before they are read
        rundir.check_resume_here(out_dir, _resume_command(preset, overrides, out_dir, max_steps, command))
    cfg = load_config(preset, overrides, notes=config_notes, resume_dir=out_dir if resume else None)
    check_command(cfg, command)  # RL on an SFT preset, or SFT on an RL preset: exit 2, nothing written
    run_dir = out_dir or Path(cfg.trainer.out_dir) / cfg.preset
    if max_steps is not None and max_steps < 1:
        raise TinyRLError(f"--max-steps {max_steps} must be at least 1", hint="e.g. --max-steps 3")
    # generated data made with other settings than this run's: its own path, said at the start
    if note := settle_train_path(cfg, run_dir if resume else None) or kept_as_it_is_note(cfg):
        config_notes.append(note)
    try:
        preset_cfg = load_config(preset, [])  # the preset's own settings: its test file's tasks
    except TinyRLError:  # a preset that needs its --set to load: nothing to compare with
        preset_cfg = None
    if preset_cfg is not None and (note := held_out_note(cfg, preset_cfg)):
        config_notes.append(note)
    check_train_path(cfg)  # a mistyped data path fails here, before anything is loaded or written
    check_data_rows(cfg)  # another task's data too: before the memory plan, init_from's merge, the model
    if resume:
        from tinyrl.rundir import check_has_run

        check_has_run(run_dir)
    return cfg, run_dir, _resume_command(preset, overrides, run_dir, max_steps, command)


def _resume_command(preset: str, overrides: Optional[list[str]], run_dir: Path, max_steps: Optional[int],
                    command: str = "train") -> str:
    import shlex

    args = ["tinyrl", command, "--preset", preset, "--out", str(run_dir), "--resume"]
    args += ["--max-steps", str(max_steps)] if max_steps else []
    for item in overrides or []:
        args += ["--set", item]
    return shlex.join(args)


def _train(cfg, run_dir: Path, resume: bool, max_steps: Optional[int], no_dashboard: bool, resume_cmd: str,
           command: str = "train", config_notes: list[str] | None = None) -> None:
    from tinyrl import interrupts, rundir
    from tinyrl.dashboard import Dashboard
    from tinyrl.memory.versus import read_run_plan
    from tinyrl.start import start_run

    log_to_stderr()
    started = start_run(cfg, run_dir, resume=resume, command=command, working=working)
    trainer = started.trainer
    # `--out RUN_DIR --resume` alone finds it; a resume keeps its own (its --max-steps, its --set):
    # the start's, kept after a resume to step 9, ended at once when the start had said 3
    rundir.record_resume_command(run_dir, resume_cmd)
    info = {"preset": cfg.preset, "model": cfg.model.name, "algorithm": started.algorithm,
            "engine": started.engine, "run_dir": str(run_dir), "device": trainer.device.type,
            "total_steps": trainer.total_steps(max_steps), "steps_per_epoch": trainer.steps_per_epoch}
    info["memory_plan"] = read_run_plan(run_dir)  # None on the CPU: no plan is made there
    with Dashboard(info, mode="plain" if no_dashboard else "auto") as dash:
        trainer.dash = dash
        for notice in (config_notes or []) + started.notes + trainer.notices:
            dash.log(notice)
        if resume:
            _show_earlier_validations(dash, run_dir)
        started_at = trainer.step
        try:
            trainer.train(max_steps)
        except TinyRLError as exc:
            if exc.resumable:  # a user's reward that broke: fixed in its file, the run goes on
                exc.hint = _continue_hint(exc.hint, trainer.saves.last_saved, resume_cmd)
            raise
    message, code = interrupts.end_of_run(trainer, run_dir, trainer.total_steps(max_steps), resume_cmd, started_at)
    if code == 0:
        _print_accuracy_change(run_dir, cfg.to_dict())
        out.print(message, highlight=False, soft_wrap=True, markup=False)
        _say_user_prints(run_dir)
        return
    if trainer.stopped_by is None:  # the run went on to its end, but not everything is on disk
        raise TinyRLError(message, hint=interrupts.unsaved_hint(trainer.saves.last_error, resume_cmd), exit_code=code)
    err.print(message, highlight=False, soft_wrap=True, markup=False)
    sys.exit(code)


def _continue_hint(hint: str, saved: Optional[int], resume_cmd: str) -> str:
    """A run stopped by a user's reward (TinyRLError.resumable): its own hint, then the command that
    continues this very run, as a Ctrl-C's message gives it. Until 2026-11-28 a reward that raised
    said nothing of resuming, and one that ended its worker a bare `--resume`, whose `--out RUN
    --resume` drops the start's --max-steps (run.json restores --preset and --set only) and ran
    on to the preset's end."""
    where = f"from its checkpoint of step {saved}" if saved is not None else "from step 0 (no checkpoint yet)"
    return f"{hint + '; then ' if hint else ''}continue the run {where} with: {resume_cmd}"


def _say_user_prints(run_dir: Path) -> None:
    """Where a user's reward function's and tools' prints went (tinyrl.rewards.worker,
    tinyrl.tools.prints: not the dashboard's stdout)."""
    from tinyrl.tasks.rewards import PRINTS_FILE as REWARD_PRINTS
    from tinyrl.tools.prints import PRINTS_FILE as TOOL_PRINTS

    for whose, name in (("reward function's", REWARD_PRINTS), ("tools'", TOOL_PRINTS)):
        prints = run_dir / name
        if prints.is_file() and (size := prints.stat().st_size):
            out.print(f"your {whose} prints ({size:,} bytes): {prints}", highlight=False, soft_wrap=True, markup=False)


def _show_earlier_validations(dash, run_dir: Path) -> None:
    """A resumed run's dashboard starts from the validations its steps so far logged (the
    trainer has cut metrics.jsonl back to the checkpoint's step), not from "–"."""
    from tinyrl.jsonl import read_records

    path = run_dir / "metrics.jsonl"
    for record in read_records(path) if path.is_file() else []:
        dash.validated(record)


def _print_accuracy_change(run_dir: Path, config: dict) -> None:
    """trainer.val_before_train: the greedy accuracy before and after this run, from metrics.jsonl
    (so a resumed run compares with its real start); otherwise the last validation's figure; and
    who judged it when a user's reward.fn did."""
    from tinyrl.report import accuracy_change, judged_by, last_validation, load_metrics

    recs = load_metrics(run_dir, [])
    change = accuracy_change(recs) or last_validation(recs)
    if change:
        judge = judged_by(config) if change.startswith("greedy") else None
        out.print(change + (f"\n{judge}" if judge else ""), highlight=False, soft_wrap=True, markup=False)
