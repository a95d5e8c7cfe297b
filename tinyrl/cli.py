"""The `tinyrl` command line. Thin commands; the only place that prints library errors.

Every command that takes --preset also takes repeatable `--set key.sub=value` overrides (each
key once: a key given twice is refused as ambiguous).
Errors: a TinyRLError becomes one screen (what is wrong + what to set) and exit code 2;
TINYRL_DEBUG=1 adds the traceback.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tinyrl.errors import TinyRLError
from tinyrl.interrupts import stop_on_closed_stdout
from tinyrl.words import counted
from tinyrl.writable import check_file_target, json_object_with, make_dir


def _flags_show_no_type() -> None:
    """Typer 0.29's help puts a type beside every option, flags too: `--resume <bool>` read as
    taking a value, and `--resume true` failed ("unexpected extra argument"). A flag (--resume,
    --greedy/--no-greedy, --help) is shown bare; other options keep their type. A Typer without
    that column is left as it is."""
    from typer import core

    shown = getattr(core.TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "flags_bare", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.flags_bare = True
    core.TyperOption.display_type_rich = display_type_rich


_flags_show_no_type()
app = typer.Typer(
    help="RL for language models (PPO with a critic, GRPO) on ONE GPU: Countdown, then maths.\n\n"
    "Start with `tinyrl presets`, then `tinyrl probe-memory`, `tinyrl estimate-cost` and "
    "`tinyrl train` with --preset NAME; each command's --help shows an example to copy.\n\n"
    "Example (the CPU demo, minutes, no GPU): tinyrl sft --preset countdown-demo-sft && tinyrl train --preset countdown-demo",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="markdown",  # a paragraph of the help flows at any width (rich kept its source line breaks)
)
presets_app = typer.Typer(help="List presets, or show one fully resolved.\n\nExample: tinyrl presets",
                          invoke_without_command=True)
# its example is a task's own (_register_data_commands): this layer names no task
data_app = typer.Typer(help="Make or convert training data for a task (`tinyrl tasks`); each task's command "
                       "has its own options (`tinyrl data NAME --help`).", no_args_is_help=True)
app.add_typer(presets_app, name="presets")
app.add_typer(data_app, name="data")

out = stop_on_closed_stdout(Console())  # `| head`: a run stops saved, not mid-step (exit 141)
err = Console(stderr=True)


def _width_from_environment() -> None:
    """Both consoles take COLUMNS as it is now. Rich reads it once, when a Console is made (at
    import): a caller that imports tinyrl.cli and then calls main() with COLUMNS set (the tests,
    doctor's helpers) would otherwise get the width of whatever terminal was there at import,
    and a long error wraps differently with the length of its paths."""
    columns = os.environ.get("COLUMNS", "")
    for console in (out, err):
        console.width = int(columns) if columns.isdigit() else None  # None: the terminal's size


@contextlib.contextmanager
def _said_if_stopped(after: Union[str, Callable[[], str]]) -> Iterator[None]:
    """Ctrl-C or SIGTERM in the body: one line, "stopped by SIGNAL" + `after` (what was under way,
    what is left on disk; a callable is asked then), and exit 130/143. Typer turns a
    KeyboardInterrupt into a silent exit 130 before main() sees it, so the signal is taken first
    (tinyrl.interrupts) and raised as Interrupted, which Typer lets through."""
    from tinyrl import interrupts

    interrupts.install()
    try:
        yield
    except interrupts.Interrupted as exc:
        said = after() if callable(after) else after
        err.print(f"stopped by {interrupts.SIGNAL_NAMES.get(exc.signum, exc.signum)}{said}",
                  highlight=False, soft_wrap=True, markup=False)
        sys.exit(interrupts.exit_code(exc.signum))


@contextlib.contextmanager
def _working(text: str) -> Iterator:
    """err.status's spinner on a terminal. Piped (a log file, nohup, CI) Rich draws none, and a
    model's load or a plan's tracing said nothing for a minute or more: there the text is a line,
    and so is each update (the doctor's few)."""
    if err.is_terminal:
        with err.status(text) as status:
            yield status
        return
    from types import SimpleNamespace

    def say(message: str) -> None:
        err.print(message, highlight=False, soft_wrap=True, markup=False)

    say(text)
    yield SimpleNamespace(update=say)


PresetOpt = typer.Option(..., "--preset", "-p", help="Preset name (see `tinyrl presets`) or path to a .toml file.")
RunPresetOpt = typer.Option(None, "--preset", "-p", help="Preset name (see `tinyrl presets`) or path to a .toml "
                            "file; with --out RUN_DIR --resume, the run's own (kept in RUN_DIR/run.json).")


def _typed(items: Optional[list[str]]):
    """The user's --set items, marked as typed (TypedSets): a key given twice among them is a
    config problem. Each command marks them as it gets them: Typer makes a plain list of what a
    callback returns."""
    from tinyrl.config import TypedSets

    return None if items is None else TypedSets(items)


SetOpt = typer.Option(None, "--set", "-s",
                      help="Override a setting, e.g. --set actor.lr=1e-6 (repeatable, one value per key: "
                      "a key given twice is refused).")
# train and sft
RunDirOpt = typer.Option(None, "--out", help="Run directory (default: runs/PRESET).")
MaxStepsOpt = typer.Option(None, help="End at this global step, before or past the preset's end (a resumed run counts on).")
ResumeOpt = typer.Option(False, "--resume", help="Continue from the latest checkpoint in the run directory.")
NoDashboardOpt = typer.Option(False, "--no-dashboard", help="Plain lines instead of the live dashboard.")


@presets_app.callback()
def presets_list(ctx: typer.Context) -> None:
    """List the presets with one line each."""
    if ctx.invoked_subcommand:
        return
    from tinyrl.config import list_presets, load_config

    table = Table(title="tinyrl presets", show_lines=False)
    table.add_column("preset", style="bold cyan")
    table.add_column("run with")  # an SFT preset's is `tinyrl sft`: the footer said `train` of every one
    table.add_column("description")
    for name in list_presets():
        cfg = load_config(name, check=False)
        table.add_row(name, f"tinyrl {cfg.command}", cfg.description)
    out.print(table)
    out.print("Show one: [bold]tinyrl presets show NAME[/]  ·  run one: [bold]tinyrl train --preset NAME[/] "
              "(an SFT preset: [bold]tinyrl sft[/], as its 'run with' says)")


@presets_app.command("show")
def presets_show(
    name: str = typer.Argument(..., metavar="NAME", help="Preset name or path to a .toml file."),
    overrides: Optional[list[str]] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of TOML-like text."),
) -> None:
    """Print the fully resolved config of a preset (defaults + file + --set overrides).

    Example (a preset of your own): tinyrl presets show countdown-tiny --set rollout.n=8 > mine.toml
    """
    from tinyrl.config import load_config, problems_of

    cfg = load_config(name, _typed(overrides), check=False)
    if as_json:
        print(json.dumps(cfg.to_dict(), indent=2))
    else:
        out.print(f"# preset {cfg.preset}: {cfg.description}", soft_wrap=True)
        # no `preset = ...` line: saved as mine.toml, this text is a preset named mine (a file's
        # name is its preset's name; load_config refuses the key)
        _print_sections({k: v for k, v in cfg.to_dict().items() if k != "preset"})
    problems = problems_of(cfg)
    if problems:  # printed in full above; exit 2 as `train` would refuse it (scripts see it too)
        # the same "what to do" as train's refusal (tinyrl.config's problems hint): it is the same config
        err.print(Panel("\n".join(f"- {p}" for p in problems) + "\n\nwhat to do: fix them with --set key.sub=value "
                        "or in the printed file (each problem says how)", border_style="red",
                        title=f"{counted(len(problems), 'problem')}: `tinyrl {cfg.command}` refuses this config"))
        raise typer.Exit(2)


def _print_sections(tree: dict, prefix: str = "") -> None:
    flat = {k: v for k, v in tree.items() if not isinstance(v, dict)}
    if prefix and flat:
        out.print()
        out.print(Text(f"[{prefix}]", style="bold"))  # Text: the brackets are TOML, not markup
    for key, value in flat.items():
        out.print(f"{key} = {json.dumps(value)}", highlight=False, soft_wrap=True, markup=False)
    for key, value in tree.items():
        if isinstance(value, dict):
            _print_sections(value, f"{prefix}.{key}" if prefix else key)


def _register_data_commands() -> None:
    """`tinyrl data TASK ...`: each task brings its own command (tinyrl/tasks/)."""
    from tinyrl.tasks import all_tasks

    for name, task in all_tasks().items():
        data_app.command(name)(_stops_cleanly(task.data_command, f" while writing the {name} data; no data "
                                              "file was written"))
    # `tinyrl data --help`'s example: the first task's first, taken from its command's help (one source)
    first = next(iter(all_tasks().values())).data_command.__doc__ or ""
    example = next((p for p in inspect.cleandoc(first).split("\n\n") if p.startswith("Example")), None)
    if example:
        data_app.info.help += "\n\n" + example


def _stops_cleanly(command: Callable, after: str) -> Callable:
    """`command` under _said_if_stopped; functools.wraps keeps its signature, which Typer reads."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        with _said_if_stopped(after):
            return command(*args, **kwargs)
    return run


_register_data_commands()


@app.command("tasks")
def tasks_list() -> None:
    """List the tasks (task.name), their templates and how to make their data.

    Example: tinyrl tasks
    """
    from tinyrl.tasks import all_tasks

    table = Table(title="tinyrl tasks")
    table.add_column("task", style="bold cyan")
    table.add_column("templates")
    table.add_column("description")
    table.add_column("data", overflow="fold")  # a command to copy: wrapped anywhere, never cut with "…"
    for name, task in all_tasks().items():
        table.add_row(name, ", ".join(task.templates), task.description, task.data_hint)
    out.print(table)
    out.print("Use one: [bold]--set task.name=NAME[/] (presets set it)  ·  data: [bold]tinyrl data NAME --help[/]")


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
            "--out runs/demo-seed2\n\n"
            "Example (continue it after a stop): tinyrl train --out runs/demo-seed2 --resume")


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
    _run_command("train", preset, _typed(overrides), out_dir, max_steps, resume, no_dashboard)


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
    _run_command("sft", preset, _typed(overrides), out_dir, max_steps, resume, no_dashboard)


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
    with _said_if_stopped(said):
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
    from tinyrl import interrupts
    from tinyrl.dashboard import Dashboard

    _log_to_stderr()
    from tinyrl.trainer import Trainer

    from tinyrl.preflight import preflight

    import torch

    on_card = cfg.trainer.device != "cpu" and torch.cuda.is_available()  # a CPU run has no card or plan to check
    with _working("checking the card, the disk and the memory plan ..." if on_card else "checking the disk and RAM ..."):
        checked = preflight(cfg, run_dir)  # fills 0 settings from the plan before config.json is written
    if command == "sft":
        from tinyrl.sft.trainer import SFTTrainer

        with _working(f"preparing {cfg.preset}: model {cfg.model.name}, SFT data ..."):
            trainer = SFTTrainer(cfg, run_dir, resume=resume)
        algorithm, engine = "sft", "none"
    else:
        with _working(f"preparing {cfg.preset}: model {cfg.model.name}, data, reward, rollout engine ..."):
            trainer = Trainer(cfg, run_dir, resume=resume)
        algorithm, engine = cfg.algorithm.adv_estimator, trainer.engine.name
    from tinyrl import rundir
    from tinyrl.memory.versus import read_run_plan, write_run_plan

    if checked.run_plan is not None:  # the run has started: its plan is kept beside it (not before)
        write_run_plan(run_dir, checked.run_plan)
    # `--out RUN_DIR --resume` alone finds it; a resume keeps its own (its --max-steps, its --set):
    # the start's, kept after a resume to step 9, ended at once when the start had said 3
    rundir.record_resume_command(run_dir, resume_cmd)
    info = {"preset": cfg.preset, "model": cfg.model.name, "algorithm": algorithm,
            "engine": engine, "run_dir": str(run_dir), "device": trainer.device.type,
            "total_steps": trainer.total_steps(max_steps), "steps_per_epoch": trainer.steps_per_epoch}
    info["memory_plan"] = read_run_plan(run_dir)  # None on the CPU: no plan is made there
    with Dashboard(info, mode="plain" if no_dashboard else "auto") as dash:
        trainer.dash = dash
        for notice in (config_notes or []) + checked.notes + trainer.notices:
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
        inputs = getattr(trainer, "inputs", None)  # the RL trainer's prompts; an SFT run has its own data
        _print_accuracy_change(run_dir, len(inputs.test_prompts) if inputs is not None else None, cfg.to_dict())
        out.print(message, highlight=False, soft_wrap=True, markup=False)
        _say_reward_prints(run_dir)
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


def _say_reward_prints(run_dir: Path) -> None:
    """Where a user's reward function's prints went (tinyrl.rewards.worker: not the dashboard's stdout)."""
    from tinyrl.tasks.rewards import PRINTS_FILE

    prints = run_dir / PRINTS_FILE
    if prints.is_file() and (size := prints.stat().st_size):
        out.print(f"your reward function's prints ({size:,} bytes): {prints}",
                  highlight=False, soft_wrap=True, markup=False)


def _show_earlier_validations(dash, run_dir: Path) -> None:
    """A resumed run's dashboard starts from the validations its steps so far logged (the
    trainer has cut metrics.jsonl back to the checkpoint's step), not from "–"."""
    from tinyrl.jsonl import read_records

    path = run_dir / "metrics.jsonl"
    for record in read_records(path) if path.is_file() else []:
        dash.validated(record)


def _print_accuracy_change(run_dir: Path, n_prompts: Optional[int], config: dict) -> None:
    """trainer.val_before_train: the greedy accuracy before and after this run, from metrics.jsonl
    (so a resumed run compares with its real start); otherwise the last validation's figure; and
    who judged it when a user's reward.fn did."""
    from tinyrl.report import accuracy_change, judged_by, last_validation, load_metrics

    recs = load_metrics(run_dir, [])
    change = accuracy_change(recs, n_prompts) or last_validation(recs, n_prompts)
    if change:
        judge = judged_by(config) if change.startswith("greedy") else None
        out.print(change + (f"\n{judge}" if judge else ""), highlight=False, soft_wrap=True, markup=False)


@app.command("probe-memory")
@functools.partial(_stops_cleanly, after=" while planning; a plan file is replaced whole or not at all")
def probe_memory(
    preset: str = PresetOpt,
    overrides: Optional[list[str]] = SetOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Card from the GPU table (default: the preset's cost.gpu); 'auto' = this machine's."),
    simulate: bool = typer.Option(False, "--simulate", help="Plan on fake tensors on the CPU, no GPU needed (the default without CUDA)."),
    device: Optional[str] = typer.Option(None, "--device", help="Real passes: cuda (this machine's card; the default with CUDA) or cpu (the CPU twin, with --memory-limit)."),
    memory_limit: Optional[str] = typer.Option(None, "--memory-limit", help="--device cpu: RAM the probe may use beyond the loaded model, e.g. 3GiB, 512MiB."),
    budget: Optional[str] = typer.Option(None, "--budget", help="Keep every phase under this (e.g. 12GiB) instead of 90% of the card. "
                                         "A plan that fits becomes the one train reads (it replaces the cached plan); "
                                         "one that does not fit leaves the cached plan as it was."),
    plan_out: Optional[Path] = typer.Option(None, "--out", help="Also write the plan here (train reads the cached copy, printed below)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """What each phase of a step holds on the card, whether it fits, and the micro-batches and
    vLLM settings `train` will use (written to a plan file that `train` reads).

    Exit codes: 0 the plan fits; 1 it does not fit (the report says which phase and what to
    change); 2 bad input (nothing planned).

    Example: tinyrl probe-memory --preset countdown-4090

    Example (no GPU here: a 4090 planned on fake tensors): tinyrl probe-memory --preset countdown-4090 --simulate --gpu rtx4090
    """
    import time

    import torch

    from tinyrl.config import load_config
    from tinyrl.memory import from_config as mp
    from tinyrl.memory import render

    cfg = load_config(preset, _typed(overrides), planning=True)
    mode = mp.choose_mode(simulate, device, memory_limit, torch.cuda.is_available())
    if plan_out is not None and mode == "cpu":  # it exited 0 and wrote nothing
        raise TinyRLError("--out writes a memory plan, and the CPU twin (--device cpu) makes none: it measures one "
                          "phase's largest micro-batch in RAM, which no run reads",
                          hint="leave out --out (--json prints the twin's result), or plan a card: "
                               f"tinyrl probe-memory --preset {cfg.preset_arg} --simulate --gpu rtx4090 --out {plan_out}")
    if plan_out is not None:  # said now, not after the plan
        check_file_target(plan_out, lambda f: json_object_with(f, "phases"), "memory plan",
                          lost="nothing was planned", example="plan.json")
    if mode == "cpu":
        limit = mp.parse_size(memory_limit)  # a bad size is said alone, before "real passes under ..."
        with _working(f"CPU probe of {cfg.model.name}: real passes under a {memory_limit} ceiling ..."):
            result = mp.cpu_probe(cfg, limit)
        if as_json:
            print(json.dumps(result, indent=2))
            return
        for part in render.render_cpu_probe(result):
            out.print(part)
        return
    card = mp.resolve_gpu(gpu, cfg, mode)
    budget_bytes = mp.parse_size(budget) if budget else None
    started = time.perf_counter()
    with _working(f"planning {cfg.model.name} on {card.name} ({'real passes' if mode == 'cuda' else 'fake tensors'}) ..."):
        plan = mp.plan_for_config(cfg, card, simulate=True, budget_bytes=budget_bytes)
        if mode == "cuda":
            plan = mp.cuda_probe(cfg, card, plan)
    seconds = time.perf_counter() - started
    path = mp.plan_path(cfg, card)
    # A --budget plan that does not fit is a question answered, not the run's plan: cached, it
    # replaced the plan train read, and estimate-cost and train then said DOES NOT FIT.
    cached = plan.fits or budget_bytes is None
    if cached:
        mp.save_plan(plan, path)
    if plan_out is not None:
        mp.save_plan(plan, plan_out)
    if as_json:
        settings = mp.apply_plan(cfg, plan)
        print(json.dumps({**mp.plan_dict(cfg, plan), "plan_file": str(plan_out or path) if cached or plan_out else None,
                          "train_reads": str(path), "written_for_train": cached,
                          "settings": settings, "seconds": round(seconds, 1)}, indent=2))
    else:
        for part in render.render_plan(cfg, plan, path, plan_out, seconds, cached=cached):
            out.print(part)
    if not plan.fits:  # scripts tell a plan that does not fit from one that does (2 is bad input)
        raise typer.Exit(1)


@app.command()
def export(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A run directory written by `tinyrl train`."),
    out_dir: Path = typer.Option(..., "--out", help="Where to write the merged Hugging Face model (a new or empty directory)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write into a non-empty --out (never the run directory)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32: the merge exactly as trained (a 3B model: ~12 GB). "
                              "base: the base model's own dtype, bf16 for Qwen2.5 (~6 GB), each merged weight rounded once."),
) -> None:
    """Write the run's latest actor as a merged Hugging Face model (base + actor adapter).

    Example (bf16, half the disk): tinyrl export runs/countdown-4090 --out countdown-4090-model --dtype base
    """
    from tinyrl.export import export_run, weights_on_disk

    # the model is written into a hidden folder in --out and moved in whole (tinyrl.writable.staged)
    with _said_if_stopped(f" while exporting {run_dir}; nothing was written in {out_dir}"):
        path = export_run(run_dir, out_dir, overwrite=overwrite, dtype=dtype)
    out.print(f"wrote {path} ({weights_on_disk(path)}): load it with AutoModelForCausalLM.from_pretrained({str(path)!r})",
              highlight=False, soft_wrap=True, markup=False)


@app.command("export-verl")
@functools.partial(_stops_cleanly, after=" while exporting the verl recipe; nothing was changed in --out "
                   "(its files move in together)")
def export_verl_cmd(
    out_dir: Path = typer.Option(..., "--out", help="Directory for the recipe: run_verl.sh, reward_fn.py, data/ and what else it needs."),
    preset: Optional[str] = typer.Option(None, "--preset", "-p", help="Preset name or .toml path (or --from-run)."),
    overrides: Optional[list[str]] = SetOpt,
    from_run: Optional[Path] = typer.Option(None, "--from-run", help="Export a run's settings (RUN_DIR/config.json)."),
    actor: Optional[Path] = typer.Option(None, "--actor", help="Start verl from this model instead of the base: a "
                                         "Hugging Face model directory such as `tinyrl export RUN --out DIR`'s DIR "
                                         "(a run directory is refused)."),
    gpus: int = typer.Option(1, "--gpus", help="GPUs per node (trainer.n_gpus_per_node)."),
    nodes: int = typer.Option(1, "--nodes", help="Nodes (trainer.nnodes)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the exported files in a non-empty --out."),
) -> None:
    """When one GPU is not enough: the same job as a verl (multi-GPU) recipe, every setting mapped.

    Example: tinyrl export-verl --preset countdown-4090 --gpus 8 --out verl-countdown

    Example (a run's settings, on 2 nodes): tinyrl export-verl --from-run runs/countdown-4090 --gpus 8 --nodes 2 --out verl-run
    """
    from tinyrl.config import load_config
    from tinyrl.export_verl import config_of_run, export_verl

    if (preset is None) == (from_run is None):
        raise TinyRLError("give exactly one of --preset NAME or --from-run RUN_DIR",
                          hint="e.g. tinyrl export-verl --preset countdown-4090 --gpus 8 --out verl-countdown")
    _log_to_stderr()  # warnings (a run's file read from here, ...) as train and eval print them
    cfg = config_of_run(from_run, _typed(overrides)) if from_run else load_config(preset, _typed(overrides))
    names: list[str] = []
    path = export_verl(cfg, out_dir, gpus=gpus, nodes=nodes, overwrite=overwrite, actor=actor,
                       source=f"run {from_run}" if from_run else f"preset {cfg.preset}",
                       warn=lambda w: err.print(w, style="yellow", highlight=False, soft_wrap=True, markup=False),
                       wrote=names.extend)
    from rich.markup import escape  # a path's [brackets] are not markup

    out.print(f"wrote {escape(str(path))}/{', '.join(names[:-1])} and {names[-1]}: run [bold]bash "
              f"{escape(str(path))}/run_verl.sh[/] where verl is installed", soft_wrap=True, highlight=False)


# Loggers whose INFO lines the user sees: one-off work on first use that takes a while (the tiny
# model's build, data generation). Others stay at WARNING: the trainer's INFO lines repeat what
# the dashboard already shows.
PROGRESS_LOGGERS = ("tinyrl.tiny_model", "tinyrl.setup")


def _log_to_stderr() -> None:
    import logging

    from rich.logging import RichHandler

    if err.is_terminal:
        handler, line = RichHandler(console=err, show_path=False, show_time=False), "%(message)s"
    else:  # piped (a log file, `| cat`): plain lines, where Rich padded each to the width and wrapped it
        handler, line = logging.StreamHandler(sys.stderr), "%(levelname)s %(message)s"
    logging.basicConfig(level=logging.WARNING, format=line, handlers=[handler])
    # huggingface_hub gives its root logger a handler of its own and lets it propagate to ours as
    # well: each warning (an offline load's "Retrying in 1s", ten of them) came out twice
    import huggingface_hub.utils.logging  # noqa: F401  (adds that handler on import: remove it after)

    hub = logging.getLogger("huggingface_hub")
    for handler in [h for h in hub.handlers if type(h) is logging.StreamHandler]:
        hub.removeHandler(handler)
    for name in PROGRESS_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)


@app.command("estimate-cost")
def estimate_cost_cmd(
    preset: Optional[str] = typer.Option(None, "--preset", "-p", help="Preset name or .toml path (optional with --from-run)."),
    overrides: Optional[list[str]] = SetOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Card from the GPU table (default: the preset's cost.gpu; 'auto' detects)."),
    price: Optional[float] = typer.Option(None, "--price", help="YOUR price per GPU-hour (default: the preset's example; 0 = unknown)."),
    currency: Optional[str] = typer.Option(None, "--currency", help="Currency label for the price (default: the preset's)."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Epochs for the total (default: trainer.total_epochs)."),
    from_run: Optional[Path] = typer.Option(None, "--from-run", help="Use a run's measured seconds/step (RUN_DIR/metrics.jsonl)."),
    sec_per_step: Optional[float] = typer.Option(None, "--sec-per-step", help="Seconds per step you already know."),
    prompts: Optional[int] = typer.Option(None, "--prompts-per-epoch", help="Prompts (RL) or rows (SFT) in one epoch (default: rows of data.train_path)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Hours and price per epoch, from a run's metrics, a given s/step, or a roofline model.

    Example (your price per GPU-hour): tinyrl estimate-cost --preset countdown-4090 --price 2.18 --currency CNY

    Example (a run's measured seconds/step): tinyrl estimate-cost --from-run runs/countdown-4090 --price 2.18
    """
    from tinyrl.config import load_config
    from tinyrl.cost import estimate_cost, render

    if preset is None and overrides:
        raise TinyRLError("--set needs --preset", hint="e.g. --preset countdown-4090 --set trainer.train_batch_size=128")
    if preset is None and from_run is None:
        raise TinyRLError("give --preset NAME, or --from-run RUN_DIR", hint="e.g. tinyrl estimate-cost --preset countdown-4090")
    _log_to_stderr()  # warnings (a run's file read from here, ...) as train and eval print them
    cfg = load_config(preset, _typed(overrides), planning=True) if preset else None
    est = estimate_cost(cfg, gpu_name=gpu, price=price, currency=currency, epochs=epochs, run_dir=from_run,
                        sec_per_step=sec_per_step, prompts=prompts)
    if as_json:
        print(json.dumps(est.to_dict(), indent=2))
        return
    for part in render(est):
        out.print(part)


@app.command("eval")
def eval_cmd(
    target: str = typer.Argument(..., metavar="RUN_DIR|MODEL", help="A run directory (its latest checkpoint), or a Hugging Face model directory or id."),
    data: Optional[list[str]] = typer.Option(None, "--data", help="Parquet file(s) of the task, name=FILE or FILE (repeatable). Default for a run directory: the files its validation scored (data.test_path as `test`, data.val_files)."),
    task: Optional[str] = typer.Option(None, "--task", help="Task (`tinyrl tasks`); default: the run's."),
    n: int = typer.Option(32, "--n", help="Sampled completions per problem (0: greedy only)."),
    k: Optional[str] = typer.Option(None, "--k", help="pass@k / maj@k for these k, each <= n (default: 1,8,32, those <= n)."),
    temperature: float = typer.Option(0.6, "--temperature", help="Sampling temperature of the n samples."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling of the n samples."),
    greedy: bool = typer.Option(True, "--greedy/--no-greedy", help="Also one greedy completion per problem (greedy accuracy)."),
    engine: str = typer.Option("auto", "--engine", help="auto (vllm on CUDA, else hf) | hf | vllm."),
    device: str = typer.Option("auto", "--device", help="auto (a run pinned to the CPU by trainer.device: the CPU; else CUDA when torch sees a GPU, else the CPU) | cpu | cuda. A run's val/score is this greedy accuracy on the device and model.dtype it validated with (on a GPU, bf16, the two can differ by a few answers)."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Response limit (default: the run's, else 1024)."),
    chat_template: Optional[bool] = typer.Option(None, "--chat-template/--no-chat-template", help="Render prompts with the tokenizer's chat template (default: the run's data.chat_template)."),
    tools: Optional[bool] = typer.Option(None, "--tools/--no-tools", help="Episodes with the task's tools (default: on when the task declares tools; limits: the run's rollout.max_turns ...)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where eval.json and eval_samples.jsonl go (default: RUN_DIR/eval or eval/MODEL)."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    reward: Optional[str] = typer.Option(None, "--reward", help="Judge by a reward function instead of the task's reward: 'run' (the run's reward.fn, as its val/score was judged) or path/to/file.py:func (solved: a score >= 1; no maj@k)."),
    as_json: bool = typer.Option(False, "--json", help="Print eval.json instead of the table."),
) -> None:
    """Greedy accuracy, mean@n, pass@k (unbiased), maj@k, response length and tokens/s on a task's data.

    Example (after the CPU demo): tinyrl eval runs/countdown-demo --n 4

    Example: tinyrl eval runs/math-grpo-4090 --data aime=data/math/aime_2024-train.parquet --k 1,8,32
    """
    from tinyrl.eval import evaluate

    try:
        ks = [int(x) for x in k.split(",") if x.strip()] if k is not None else None
    except ValueError as e:
        raise TinyRLError(f"--k {k!r} is not a list of integers", hint="e.g. --k 1,8,32") from e
    if engine not in ("auto", "hf", "vllm"):
        raise TinyRLError(f"--engine {engine!r} is not auto, hf or vllm", hint="e.g. --engine hf")
    _log_to_stderr()
    # SIGTERM killed eval outright, leaving the run's merged model (a 3B: ~12 GB) in TMPDIR; as
    # Interrupted it unwinds through the temporary directory. Ctrl-C ended silently (Typer's exit 130).
    with _said_if_stopped("; nothing was written"):
        summary, where = evaluate(target, data, task_name=task, n=n, ks=ks, temperature=temperature, top_p=top_p,
                                  greedy=greedy, engine=engine, max_new_tokens=max_tokens, out_dir=out_dir,
                                  chat_template=chat_template, seed=seed, progress=not as_json, tools=tools,
                                  device=device, reward=reward)
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    out.print(eval_table(summary))
    if "judged_by" in summary:
        out.print(f"judged by {summary['judged_by']}", highlight=False, soft_wrap=True, markup=False)
    if "tools_left_out" in summary:
        out.print(f"note: {summary['tools_left_out']}", highlight=False, soft_wrap=True, markup=False)
    out.print(f"wrote {where / 'eval.json'} and {where / 'eval_samples.jsonl'}",
              highlight=False, soft_wrap=True, markup=False)


def eval_table(summary: dict) -> Table:
    """eval.json's metrics as a table: rates to 4 places, lengths to 1, counts and tokens/s whole; the title
    says "greedy only" for --n 0 (no sample was drawn at T)."""
    sampled = f"n={summary['n']} T={summary['temperature']}" if summary["n"] else "greedy only"
    title = f"tinyrl eval · {summary['model']} · task {summary['task']} · {summary['engine']} on " \
            f"{summary['device']} · {sampled}"
    # as wide as its title (the console caps it): a three-column table's width wrapped it in three lines
    table = Table(title=title, min_width=len(title))
    table.add_column("data", style="bold cyan")
    table.add_column("metric")
    table.add_column("value", justify="right")
    places = {"tokens_per_s": ",.0f", "response_length": ".1f", "tools/seconds": ".1f", "episode/turns": ".2f",
              **dict.fromkeys(("tools/calls", "tools/errors", "tools/timeouts", "episode/tokenization_mismatch",
                               "episode/text_mismatch"), ",.0f")}  # counts
    for name, metrics in summary["files"].items():
        for key, value in metrics.items():
            if key != "path":
                table.add_row(name, key, format(value, places.get(key, ".4f")) if isinstance(value, float)
                              else f"{value:,}" if isinstance(value, int) else str(value))
    return table


@app.command("doctor")
def doctor_cmd(
    preset: str = typer.Option("countdown-tiny", "--preset", "-p", help="Preset to try (name or .toml path)."),
    overrides: Optional[list[str]] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Print ONE JSON object (the whole report) instead of the table."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Also write the JSON report here (for a bug report)."),
    bench: bool = typer.Option(False, "--bench", help="Also time a few steps at the preset's planned settings, with the cost of an epoch."),
    bench_steps: Optional[int] = typer.Option(
        None, "--bench-steps", help="Steps the bench runs (implies --bench; default 3, at least 3: the first is warm-up)"),
) -> None:
    """Check this machine for a preset: versions, card, driver, vLLM, disk, RAM, then two real
    training steps (sleep/wake, parity, adapter sync, memory vs plan). Exit 0: all passed;
    1: a check failed (each failure says what to do); 2: bad input.

    Example (+ a few timed steps and an epoch's cost): tinyrl doctor --preset countdown-4090 --bench

    Example (a report for a bug report): tinyrl doctor --json --out doctor.json
    """
    from tinyrl.doctor import run_doctor
    from tinyrl.doctor.render import render

    bench = bench or bench_steps is not None  # asking for the bench's steps asks for the bench (was ignored)
    bench_steps = 3 if bench_steps is None else bench_steps
    if bench and bench_steps < 3:
        raise TinyRLError(f"--bench-steps {bench_steps}: the bench needs at least 3 (one warm-up, two timed)",
                          hint="e.g. --bench-steps 3")
    if out_file is not None:  # said now, not after the two steps
        check_file_target(out_file, lambda f: json_object_with(f, "tool", "tinyrl doctor"), "doctor report",
                          lost="no check was run", example="doctor.json")
    _log_to_stderr()
    now = {"doing": "reading the config", "written": False}
    kept = out_file is not None and out_file.exists()

    def said() -> str:  # asked when the signal comes: what was under way, what is on disk
        if now["written"]:
            left = f"the report was written to {out_file}"
        elif out_file is None:
            left = "nothing was written"
        else:
            left = (f"nothing was written ({out_file} is written only at the end"
                    + ("; it holds the last report, unchanged)" if kept else ")"))
        if now["doing"].startswith("running "):  # the trial's or the bench's run: in a temporary directory
            left = "the temporary run directory was removed; " + left
        return f" while {now['doing']}; {left}"

    def progress(message: str) -> None:
        now["doing"] = message.removesuffix(" ...")
        status.update(message)

    # Ctrl-C/SIGTERM: one line and exit 130/143, as every command. Until 2026-11-27 the doctor
    # ended silently (Typer's exit 130), and in its trial the trainer's graceful stop took the
    # signal, after which the doctor went on (tinyrl.interrupts.throwaway).
    with _said_if_stopped(said):
        with _working("tinyrl doctor ...") as status:
            report = run_doctor(preset, _typed(overrides), bench=bench, bench_steps=bench_steps, progress=progress)
        text = report.to_json()
        if out_file is not None:  # the file the user named (a re-run replaces its last report), written whole
            from tinyrl.jsonl import write_atomic

            now["doing"] = f"writing the report to {out_file}"
            make_dir(out_file.parent)
            write_atomic(out_file, text + "\n")
            now["written"] = True
        now["doing"] = "printing the report"
        if as_json:
            print(text)
        else:
            for part in render(report):
                out.print(part)
            if out_file is not None:
                out.print(f"report written to {out_file}", highlight=False, soft_wrap=True, markup=False)
    sys.exit(report.exit_code)


@app.command("report")
def report(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A run directory written by `tinyrl train` or `tinyrl sft` (holds metrics.jsonl)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where to write (default: RUN_DIR/report)."),
) -> None:
    """PNG plots (reward, KL, length, memory, phase timings, validation, tool use) and summary.txt of a run.

    Example: tinyrl report runs/countdown-demo
    """
    from tinyrl.report import write_report

    where = out_dir or run_dir / "report"  # plots and summary.txt move in together (write_report)
    with _said_if_stopped(f" while writing the report of {run_dir}; no plot or summary in {where} was changed"):
        files = write_report(run_dir, out_dir)
    for path in files:
        out.print(str(path), highlight=False, soft_wrap=True, markup=False)
    out.print()
    out.print(files[-1].read_text(), markup=False, highlight=False, soft_wrap=True)  # summary.txt


def main() -> None:
    from tinyrl._compat import quiet_library_deprecations

    _width_from_environment()
    quiet_library_deprecations()
    try:  # no KeyboardInterrupt reaches here (Typer exits 130 on it): see _said_if_stopped
        app()
    except TinyRLError as exc:
        if os.environ.get("TINYRL_DEBUG"):
            traceback.print_exc()
        body = Text(exc.message)  # Text, not markup: messages contain [brackets]
        if exc.hint:
            body.append("\n\nwhat to do: ", style="bold").append(exc.hint)
        err.print(Panel(body, title="tinyrl: error", border_style="red", expand=False))
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
