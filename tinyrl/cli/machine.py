"""Before a run, about this machine and its card: `probe-memory`, `estimate-cost`, `doctor`."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tinyrl.cli.common import (PresetOpt, SetOpt, app, log_to_stderr, out, said_if_stopped, stops_cleanly,
                               typed, working)
from tinyrl.errors import TinyRLError
from tinyrl.writable import check_file_target, json_object_with, make_dir


@app.command("probe-memory")
@functools.partial(stops_cleanly, after=" while planning; a plan file is replaced whole or not at all")
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

    cfg = load_config(preset, typed(overrides), planning=True)
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
        with working(f"CPU probe of {cfg.model.name}: real passes under a {memory_limit} ceiling ..."):
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
    with working(f"planning {cfg.model.name} on {card.name} ({'real passes' if mode == 'cuda' else 'fake tensors'}) ..."):
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
    log_to_stderr()  # warnings (a run's file read from here, ...) as train and eval print them
    cfg = load_config(preset, typed(overrides), planning=True) if preset else None
    est = estimate_cost(cfg, gpu_name=gpu, price=price, currency=currency, epochs=epochs, run_dir=from_run,
                        sec_per_step=sec_per_step, prompts=prompts)
    if as_json:
        print(json.dumps(est.to_dict(), indent=2))
        return
    for part in render(est):
        out.print(part)



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
    log_to_stderr()
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
    with said_if_stopped(said):
        with working("tinyrl doctor ...") as status:
            report = run_doctor(preset, typed(overrides), bench=bench, bench_steps=bench_steps, progress=progress)
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
