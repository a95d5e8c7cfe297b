"""`tinyrl export`: a run's latest actor (`tinyrl train` or `tinyrl sft`) as a plain Hugging Face
model directory.

LoRA runs: base + the "actor" adapter merged into the weights (merge_and_unload), so the result
loads with AutoModelForCausalLM alone, no peft needed. Full runs: the trained actor weights.
The tokenizer is saved beside it (with model.custom_chat_template when the run set one). A run
started with model.init_from is merged into its own starting model (tinyrl.init_from).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError

from tinyrl import checkpoint as ckpt
from tinyrl import rundir
from tinyrl.config import config_from_dict
from tinyrl.errors import TinyRLError
from tinyrl.export_info import ExportInfo
from tinyrl.roles import Role
from tinyrl.writable import check_writable, make_dir, staged


def check_out_dir(run_dir: Path, out_dir: Path, overwrite: bool) -> None:
    """Never the run directory itself (its config.json would be replaced, and the run could no
    longer be exported or resumed); a non-empty directory only with --overwrite."""
    if out_dir.exists() and out_dir.resolve() == run_dir.resolve():
        raise TinyRLError(f"--out {out_dir} is the run directory itself: the export would overwrite the "
                          "run's config.json; nothing was written",
                          hint=f"choose another directory, e.g. --out {run_dir / 'export'}")
    check_writable(out_dir, lost="nothing was written", example="exported-actor")  # a file, inside one, read-only
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise TinyRLError(f"--out {out_dir} is not empty; nothing was written",
                          hint="choose a new or empty directory, or add --overwrite to write the model "
                               "files over what is there")


DTYPES = {"float32": "the merge exactly as trained (the default)",
          "base": "the base model's own dtype (bf16 for Qwen2.5): half the disk, each merged weight rounded once"}


def export_run(run_dir: Path, out_dir: Path, overwrite: bool = False, dtype: str = "float32") -> Path:
    """dtype (a DTYPES key): the merge is computed in fp32 either way; "base" then rounds it to the
    base model's dtype. model.init_from's starting model uses "base" (the GPU trainer loads bf16)."""
    from transformers import AutoModelForCausalLM

    from tinyrl._compat import loading_bars_only_on_a_terminal
    from tinyrl.init_from import base_of_run
    from tinyrl.setup import load_tokenizer

    if dtype not in DTYPES:
        raise TinyRLError(f"--dtype {dtype} is not one of {', '.join(DTYPES)}; nothing was written",
                          hint="; ".join(f"{name}: {what}" for name, what in DTYPES.items()))
    config_path = run_dir / "config.json"
    if starting := rundir.starting_run(run_dir):
        raise starting
    if not config_path.exists():
        raise TinyRLError(f"{run_dir} is not a run directory (no config.json)",
                          hint="pass the --out directory of a `tinyrl train` or `tinyrl sft` run")
    check_out_dir(run_dir, out_dir, overwrite)
    cfg = config_from_dict(json.loads(config_path.read_text()))
    rundir.rebase_paths(cfg, run_dir)  # a relative local model.name: from where the run started
    state = ckpt.load_latest(run_dir / "checkpoints")
    if state is None:
        every = cfg.trainer.save_every
        raise TinyRLError(f"{run_dir} has no checkpoint yet: nothing of it can be loaded",
                          hint="a run saves " + (f"every {every} steps and " if every else "")
                          + "at its last step: wait for its first save, or continue it (the command that "
                          "started it, with --resume)")
    model_path = base_of_run(cfg, run_dir)  # model.init_from: the run's own starting model
    from tinyrl.model_specs import hub_load_options

    loading_bars_only_on_a_terminal()
    try:
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                    **hub_load_options(model_path, weights=True)[0])
    except OSError as exc:  # a local base moved away reads as a Hub id: a download was tried
        start = rundir.start_dir(run_dir)
        raise TinyRLError(f"cannot load {run_dir}'s base model {model_path!r} (model.name = {cfg.model.name}): "
                          f"{str(exc).splitlines()[0]}; nothing was written",
                          hint="a local model directory is looked for from here"
                               + (f" and from {start}, where the run started" if start else "")
                               + "; put it back there, or on a machine without internet have the "
                                 "Hugging Face model in the cache") from exc
    actor_state = state["models"][str(Role.ACTOR)]
    if cfg.model.finetune == "lora":
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        lora = LoraConfig(r=cfg.model.lora_rank, lora_alpha=cfg.model.lora_alpha,
                          target_modules=list(cfg.model.lora_targets), task_type="CAUSAL_LM")
        model = get_peft_model(base, lora, adapter_name=str(Role.ACTOR))
        set_peft_model_state_dict(model, actor_state, adapter_name=str(Role.ACTOR))
        merged = model.merge_and_unload()
    else:
        base.load_state_dict(actor_state)
        merged = base
    if dtype == "base":
        from transformers import AutoConfig

        own = getattr(AutoConfig.from_pretrained(model_path, **hub_load_options(model_path)[0]), "dtype", None) \
            or torch.float32
        merged = merged.to(getattr(torch, own) if isinstance(own, str) else own)
    need = sum(t.numel() * t.element_size() for t in merged.state_dict().values())  # tied weights twice: a bound
    make_dir(out_dir, example="exported-actor")
    free = shutil.disk_usage(out_dir).free
    room = ("free disk space, or write to a disk with room (`tinyrl eval` of a run merges it under "
            f"TMPDIR, now {tempfile.gettempdir()})"
            + ("; `tinyrl export --dtype base` writes a bf16 base's merge in half the space" if dtype == "float32" else ""))
    if need > free:
        raise TinyRLError(f"the merged model needs ~{ckpt.human_bytes(need)} in {out_dir} and "
                          f"{ckpt.human_bytes(free)} are free; nothing was written", hint=room)
    try:  # a full disk left config.json without weights: from_pretrained failed on it, a rerun refused
        with staged(out_dir, replace=overwrite) as stage:
            merged.save_pretrained(stage)
            load_tokenizer(model_path, cfg.model.custom_chat_template).save_pretrained(stage)
            ExportInfo(str(run_dir), state["step"], cfg.model.name, vars(cfg.task)).write(stage)  # last: finished
    except (OSError, SafetensorError) as exc:  # safetensors reports its own failed writes (ENOSPC) as SafetensorError
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise TinyRLError(f"writing the merged model into {out_dir} failed: {why}; nothing was "
                          "written there", hint=room) from exc
    return out_dir


def weights_on_disk(model_dir: Path) -> str:
    """e.g. "5.8 GiB of bfloat16 weights": what an export wrote, for the line that reports it."""
    size = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    config = json.loads((model_dir / "config.json").read_text())
    return f"{ckpt.human_bytes(size)} of {config.get('dtype') or config.get('torch_dtype') or 'float32'} weights"
