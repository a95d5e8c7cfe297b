"""Checks `train` runs before it loads a model or writes anything: failures that would otherwise
come minutes or hours into a run, said up front with what to change.

    1 the card     a torch build without kernels for it (RTX 5090, sm_120) fails here, not at
                   the first kernel launch; the vLLM package, when the run rolls out with it
    2 the disk     the run directory can be written (not a file, not on a read-only disk), and
                   room for two checkpoints and the training data in their filesystems
    3 the memory   the card's plan (cached by probe-memory, else simulated now): does every phase
                   fit; the micro-batch budgets and vLLM settings left at 0 are filled from it

Knows: the config, the card, the filesystem. Does not know: how plans are made
(tinyrl.memory.from_config) or how anything is printed (the CLI shows the returned notes).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tinyrl.config import DEFAULT_MICRO_TOKENS, Config, has_critic, resolve_path
from tinyrl.errors import TinyRLError
from tinyrl.hardware import GPU, check_arch_supported, detect_gpu, nvidia_driver_version, why_no_cuda
from tinyrl.memory import formulas as fm
from tinyrl.memory import from_config as mp
from tinyrl.writable import check_writable, nearest_existing

GiB = fm.GiB
MiB = fm.MiB

# Generated Countdown parquet: ~36 bytes a row measured (8,192 rows in 284 KiB); 2x for other
# templates and longer tasks. Plus logs (metrics, samples, timeline) and the OS's own slack.
DATA_BYTES_PER_ROW = 72
RUN_LOGS_BYTES = 64 * MiB
CHECKPOINTS_NEEDED = 2  # the newest plus the one being written (or kept while it is written)


@dataclass
class Checked:
    """What preflight found: notes worth showing, and on a card the memory plan the run trains
    with (plan_dict), which the command keeps as RUN_DIR/memory_plan.json (tinyrl.memory.versus)
    once the run has started: a start refused at a later input check leaves nothing."""
    notes: list[str] = field(default_factory=list)
    run_plan: dict | None = None  # None on the CPU: no plan is made there


def preflight(cfg: Config, run_dir: Path) -> Checked:
    """Raises TinyRLError for what would fail later. May fill cfg's micro-batch budgets and vLLM
    settings (only those left at 0) from the memory plan of the preset's command (an RL step,
    or an SFT step: tinyrl.memory.plan.build_plan)."""
    check_writable(run_dir)
    gpu = _card(cfg)
    check_engine_installed(cfg, cuda=gpu is not None)
    notes = check_disk(cfg, run_dir, cuda=gpu is not None)
    if gpu is None:
        if cfg.trainer.device == "auto" and nvidia_driver_version():
            notes.append(f"WARNING: this machine has an NVIDIA driver but the run is on the CPU: {why_no_cuda()}")
        # the budgets the trainer takes (a 0 is DEFAULT_MICRO_TOKENS), not "critic default tokens"
        critic = f", critic {cfg.critic.micro_batch_tokens or DEFAULT_MICRO_TOKENS}" if has_critic(cfg) else ""
        notes.append("memory planning applies to CUDA cards; this CPU run uses the preset's micro-batch "
                     f"budgets (actor {cfg.actor.micro_batch_tokens or DEFAULT_MICRO_TOKENS}{critic} tokens)")
        return Checked(notes)
    memory_notes, run_plan = check_memory(cfg, gpu)
    return Checked(notes + memory_notes, run_plan)


def _card(cfg: Config) -> GPU | None:
    """This machine's card when the run will use CUDA, checked against the torch build."""
    import torch

    if cfg.trainer.device == "cpu" or (cfg.trainer.device == "auto" and not torch.cuda.is_available()):
        return None
    gpu = detect_gpu()
    if gpu is None:
        raise TinyRLError(f"trainer.device = cuda but torch sees no CUDA card: {why_no_cuda()}",
                          hint="fix the install as said above, or set trainer.device=cpu (slow for real models)")
    problem = check_arch_supported(gpu)
    if problem:
        raise TinyRLError(problem, hint="install a torch build for this card (see pytorch.org's install "
                                        "selector); nothing was loaded or written")
    return gpu


def check_engine_installed(cfg: Config, cuda: bool) -> None:
    """An RL run whose engine is vLLM (rollout.engine = vllm, or auto on a card) on a machine
    without the package: said before model.init_from's merge and the model load, not after them.
    find_spec, not an import: vLLM takes seconds to import, and the engine imports it anyway
    (a broken install is said there, with the same hint)."""
    import importlib.util

    from tinyrl.rollout.factory import rolls_out_with_vllm

    if not rolls_out_with_vllm(cfg, cuda):
        return
    if importlib.util.find_spec("vllm") is None:
        from tinyrl.rollout.vllm_engine import vllm_missing

        raise vllm_missing("No module named 'vllm'")


# ------------------------------------------------------------------------------- disk

def free_disk_bytes(path: Path) -> int:
    """Free bytes in the filesystem that `path` is, or will be, created in."""
    return shutil.disk_usage(nearest_existing(path)).free


def checkpoint_bytes(cfg: Config, cuda: bool) -> int:
    """One checkpoint's size from the config: the trainable weights (LoRA adapters, fp32 as peft
    keeps them; or the full actor and critic in the model dtype), the value head, and Adam's
    two moments for what each optimizer steps; the critic's parts only when the estimator has one."""
    from tinyrl.model_specs import load_spec, param_count

    spec = load_spec(cfg.model.name)
    critic = has_critic(cfg)
    head = fm.value_head_params(spec)
    if cfg.model.finetune == "lora":
        adapter = fm.lora_param_count(spec, cfg.model.lora_rank, tuple(cfg.model.lora_targets))
        trained = adapter + (adapter + head if critic else 0)
        weights, adam = 4 * trained, fm.adam_state_bytes(trained)
    else:
        dtype = cfg.model.dtype if cfg.model.dtype != "auto" else ("bf16" if cuda else "fp32")
        d, n = fm.dtype_bytes(dtype), param_count(spec)
        weights = (2 * n * d + 4 * head) if critic else n * d
        adam = 2 * d * (n + (n if critic else 0)) + (8 * head if critic else 0)
    return int((weights + adam) * 1.05) + MiB  # torch.save's pickling and alignment


def check_disk(cfg: Config, run_dir: Path, cuda: bool) -> list[str]:

    """Room for two checkpoints + logs in run_dir's filesystem, and for the training data where
    it will be generated; raises with the numbers when either is short."""
    from tinyrl.checkpoint import human_bytes
    from tinyrl.model_specs import load_spec

    try:
        load_spec(cfg.model.name)
    except TinyRLError:  # a model we ship no config for: its size is known once it loads
        return [f"disk: no config for {cfg.model.name} here, so checkpoint sizes were not checked"]
    need = {nearest_existing(run_dir): CHECKPOINTS_NEEDED * checkpoint_bytes(cfg, cuda) + RUN_LOGS_BYTES}
    data = resolve_path(cfg.data.train_path)
    if not data.exists():  # generated on first use
        where = nearest_existing(data)
        fs = next((p for p in need if p.stat().st_dev == where.stat().st_dev), where)
        need[fs] = need.get(fs, 0) + cfg.data.generate_train_size * DATA_BYTES_PER_ROW
    for where, needed in need.items():
        free = free_disk_bytes(where)
        if free < needed:
            raise TinyRLError(
                f"not enough disk: this run needs {human_bytes(needed)} in {where} ({CHECKPOINTS_NEEDED} "
                f"checkpoints of {human_bytes(checkpoint_bytes(cfg, cuda))}, {human_bytes(RUN_LOGS_BYTES)} "
                "for logs" + (", training data" if not data.exists() else "") + f") and {human_bytes(free)} is free",
                hint="free disk space there, or write the run elsewhere with --out DIR; nothing was written")
    return [f"disk: {human_bytes(sum(need.values()))} needed for checkpoints, logs and data; enough free"]


# ------------------------------------------------------------------------------- memory

def _measured_then(cfg: Config, path: Path) -> tuple[str, str]:
    """(a line for the refusal, the hint's first clause) for a cached plan that probe-memory
    MEASURED on this card and that does not fit: memory other processes held on the card while
    it probed counted against it, and the plan keeps that verdict until probed again. Until
    2026-11-28 train refused on it for good after a notebook or another job had ended, saying
    only to change settings. (A simulated plan depends on nothing outside its cache key.)"""
    import time

    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
    return (f"\n  (MEASURED by `tinyrl probe-memory` on this card at {when}: memory that other processes held "
            "on the card then counted against it)",
            f"if the card has more memory free now than then (another job or a notebook ended), measure again: "
            f"`tinyrl probe-memory --preset {cfg.preset_arg}` with this run's --set options (it replaces {path}); "
            "or ")


def check_memory(cfg: Config, gpu: GPU) -> tuple[list[str], dict]:
    """The card's plan: raises when a phase does not fit, fills the settings left at 0 -> (notes,
    the plan's record for the run directory: report and dashboard hold the measured peaks
    against it)."""
    plan, path, cached = mp.load_or_build_plan(cfg, gpu)
    source = (f"memory plan from {path}" if cached else
              f"memory plan SIMULATED now (fake tensors; none cached for this config on {gpu.name}), "
              f"saved to {path}; `tinyrl probe-memory` measures it on the card")
    if not plan.fits:
        measured, again = _measured_then(cfg, path) if cached and not plan.simulated else ("", "")
        raise TinyRLError(f"the memory plan for {cfg.model.name} on {gpu.name} does not fit:\n"
                          + "\n".join(f"  {line}" for line in mp.advice(cfg, plan)) + measured,
                          hint=f"{again}change the settings above with --set, then run again "
                               "(`tinyrl probe-memory` shows every phase)")
    settings = mp.apply_plan(cfg, plan)
    return [source] + settings, mp.plan_dict(cfg, plan)
