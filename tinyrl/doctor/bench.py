"""`tinyrl doctor --bench`: a few steps of the preset at its planned settings, timed on this
machine, and what an epoch costs from them.

The steps are a real `tinyrl train` (an SFT preset: `tinyrl sft`) in a child process (its own vLLM engine: one per process;
preflight fills the micro-batches and vLLM's share from the memory plan exactly as a real run
does), into a temporary run directory. Its metrics.jsonl is then read as `estimate-cost
--from-run` reads it (tinyrl.cost.estimate_cost): the first step is warm-up, the median of the
rest is the step time.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tinyrl.config import layered, load_config, resolve_path
from tinyrl.doctor.report import Report, Row
from tinyrl.errors import TinyRLError


def bench_command(preset: str, overrides: list[str] | None, steps: int, run_dir: Path, extra: list[str],
                  command: str = "train") -> list[str]:
    args = [sys.executable, "-m", "tinyrl.cli", command, "--preset", preset, "--max-steps", str(steps),
            "--out", str(run_dir), "--no-dashboard"]
    # No validation or mid-run checkpoints: the bench times training steps. layered: the CLI
    # refuses a key given twice, and a user's trainer.test_every must not stop the bench.
    for item in layered(overrides, extra + ["trainer.test_every=0", "trainer.save_every=0"]):
        args += ["--set", item]
    return args


def bench_rows(preset: str, overrides: list[str] | None, steps: int, report: Report) -> list[Row]:
    import torch

    cfg = load_config(preset, overrides)
    workdir = Path(tempfile.mkdtemp(prefix="tinyrl-bench-"))
    try:
        extra = []
        if not resolve_path(cfg.data.train_path).exists():  # the doctor writes nothing outside its temp dir
            from tinyrl.doctor.trial import ensure_data

            probe = load_config(preset, overrides)
            ensure_data(probe, workdir, rows=max(256, cfg.trainer.train_batch_size * (steps + 1)))
            extra.append(f"data.train_path={probe.data.train_path}")
        run_dir = workdir / "run"
        args = bench_command(preset, overrides, steps, run_dir, extra, cfg.command)
        done = _run_child(args)
        shown = shlex.join(["tinyrl", *args[3:]])
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-12:]
            return [Row("bench", "fail", f"`{shown}` exited with {done.returncode}: " + " / ".join(tail),
                        fix="run that command yourself to see the whole error; attach this report to an issue",
                        basis="measured", data={"command": shown, "stderr_tail": tail})]
        cuda = torch.cuda.is_available() and cfg.trainer.device != "cpu"
        return _rows(cfg, run_dir, shown, cuda, report)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_child(args: list[str]) -> subprocess.CompletedProcess:
    """subprocess.run(args, capture_output=True, text=True), the child in a session of its own: a
    signal that stops the doctor (tinyrl.interrupts.Interrupted) kills it and what it started (a
    vLLM engine's process) before its temporary run directory is removed. A SIGTERM to the doctor
    alone ended the doctor at once and left the child training into a directory nobody removed."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:  # its exit closes the pipes and waits for the child
        try:
            stdout, stderr = proc.communicate()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def _rows(cfg, run_dir: Path, shown: str, cuda: bool, report: Report) -> list[Row]:
    from tinyrl import jsonl
    from tinyrl.cost import estimate_cost, read_run

    try:
        # On the CPU a card's example price would be a made-up figure: price unknown (0) there.
        est = estimate_cost(cfg, run_dir=run_dir, gpu_name="auto" if cuda else None, price=None if cuda else 0.0)
    except TinyRLError as exc:
        return [Row("bench", "fail", exc.message, fix=exc.hint, basis="measured")]
    steps = [m for m in jsonl.read_records(run_dir / "metrics.jsonl") if "timing/step" in m]
    timing = read_run(run_dir)  # as estimate_cost read it: which steps were warm-up
    warmup = set(timing.warmup_steps)
    steady = [m for m in steps if m["step"] not in warmup]
    tokens = statistics.median(m["perf/tokens_per_s"] for m in steady)
    gen = None if cfg.command == "sft" else statistics.median(  # an SFT step generates nothing
        m["response_length/mean"] * cfg.trainer.train_batch_size * cfg.rollout.n / max(m["timing/rollout"], 1e-9)
        for m in steady)
    from tinyrl.phases import STEP_PHASES

    order = [str(p) for p in STEP_PHASES]
    phases = ", ".join(f"{k} {v:.2f}" for k, v in sorted(est.phases.items(),
                                                        key=lambda kv: order.index(kv[0]) if kv[0] in order else 99))
    where = "this card" if cuda else "this machine's CPU"
    step_row = Row("bench: step", "pass",
                   f"{est.sec_per_step:.2f} s/step on {where} (median of {timing.steady_steps} steps after "
                   f"{len(warmup)} warm-up); per phase (s): {phases}; "
                   f"{tokens:,.0f} tokens/s (prompt + response)"
                   + (f", rollout {gen:,.0f} generated tokens/s" if gen is not None else ""),
                   basis="measured", data={"command": shown, "sec_per_step": est.sec_per_step, "phases": est.phases,
                                           "tokens_per_s": tokens, "rollout_tokens_per_s": gen})
    price = (f", {est.price_per_epoch:,.2f} {est.currency}/epoch at {est.price_per_hour} {est.currency}/h "
             f"({est.price_source})" if est.price_per_epoch is not None else "; price: give yours to "
             f"`tinyrl estimate-cost --from-run RUN --price P`")
    card = "" if cuda else f" (roofline comparison for {est.gpu['name']}, the preset's card; the seconds are this CPU's)"
    cost_row = Row("bench: cost", "pass",
                   f"{est.steps_per_epoch:,} steps/epoch x {est.sec_per_step:.2f} s = {est.hours_per_epoch:,.2f} h/epoch"
                   f"{price}; {est.epochs} epoch(s): {est.total_hours:,.1f} h{card}", basis="measured",
                   data={"estimate": est.to_dict()})
    report.bench = {"command": shown, "metrics": steps, "estimate": est.to_dict()}
    return [step_row, cost_row]

