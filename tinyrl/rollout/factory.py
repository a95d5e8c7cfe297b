"""Pick and build a rollout engine: `hf`, `vllm` or `auto` (vLLM on CUDA when it imports).

What this file does not know: how either engine works inside; it only chooses and builds.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

import torch

from tinyrl.errors import TinyRLError
from tinyrl.rollout.base import RolloutEngine

log = logging.getLogger(__name__)

ENGINE_KINDS = ("hf", "vllm", "auto")


def resolve_engine(kind: str, cuda: bool) -> str:
    """The engine `kind` builds: "auto" is vLLM on CUDA and hf elsewhere (_auto; on CUDA a vLLM
    that does not import is an error there, not a fallback); "hf" and "vllm" are themselves."""
    return ("vllm" if cuda else "hf") if kind == "auto" else kind


def rolls_out_with_vllm(cfg, cuda: bool) -> bool:
    """Whether a run of `cfg` (a tinyrl Config) rolls out with vLLM on this machine: `tinyrl
    train` with rollout.engine = vllm, or auto on a card (_auto). No other command builds a
    rollout engine: an SFT step rolls nothing out (sft.val_generate samples with the hf engine)."""
    return cfg.command == "train" and resolve_engine(cfg.rollout.engine, cuda) == "vllm"


def make_engine(
    kind: str,
    *,
    model: torch.nn.Module | None,
    tokenizer,
    model_path: str | Path | None = None,
    device: str | torch.device = "cpu",
    **vllm_kwargs,
) -> RolloutEngine:
    """Build the engine. For vLLM, `model` (the trainer's actor) is synced in right away, so
    the engine serves exactly the trainer's weights from the first rollout (a resumed run
    included); a peft actor turns LoRA serving on unless `enable_lora` says otherwise."""
    builders = {"hf": _hf, "vllm": _vllm, "auto": _auto}
    if kind not in builders:
        raise TinyRLError(f"unknown rollout engine {kind!r}",
                          hint=f"set rollout.engine to one of: {', '.join(ENGINE_KINDS)}")
    return builders[kind](model=model, tokenizer=tokenizer, model_path=model_path, device=device,
                          **vllm_kwargs)


def _hf(*, model, tokenizer, model_path, device, **vllm_kwargs):
    from tinyrl.rollout.hf_engine import HFEngine

    if model is None:
        raise TinyRLError("the hf rollout engine samples from the trainer's model, and none was given",
                          hint="build the actor model before the engine")
    return HFEngine(model, tokenizer, device)


def _vllm(*, model, tokenizer, model_path, device, **vllm_kwargs):
    from tinyrl.rollout.vllm_engine import VLLMEngine, import_vllm

    import_vllm()  # a TinyRLError with the install hint when vLLM is missing or broken
    if model_path is None:
        raise TinyRLError("the vllm rollout engine needs the model's path",
                          hint="set model.name to a local directory or a Hugging Face name")
    engine = VLLMEngine(model_path, tokenizer, **vllm_engine_kwargs(model, vllm_kwargs))
    if model is not None:
        engine.sync_weights(model)
    return engine


def vllm_engine_kwargs(model: torch.nn.Module | None, vllm_kwargs: dict) -> dict:
    """The keyword arguments VLLMEngine gets: the trainer's settings, plus LoRA serving for a
    peft actor (rank: its largest adapter's) unless the settings say otherwise."""
    out = dict(vllm_kwargs)
    peft_config = getattr(model, "peft_config", None)
    if peft_config:
        out.setdefault("enable_lora", True)
        ranks = [getattr(c, "r", 0) for c in peft_config.values()]
        out.setdefault("max_lora_rank", max(ranks + [1]))
    return out


def _auto(*, model, tokenizer, model_path, device, **vllm_kwargs):
    """vLLM on CUDA, hf elsewhere. On CUDA a vLLM that does not import is an error, not a
    silent fallback: the memory plan gave vLLM its share of the card and sized the trainer's
    micro-batches around it, and the hf engine is several times slower at rollouts."""
    if resolve_engine("auto", torch.device(device).type == "cuda") == "hf":
        log.info("rollout engine: hf (no CUDA device)")
        return _hf(model=model, tokenizer=tokenizer, model_path=model_path, device=device)
    reason = _vllm_unusable_reason()
    if reason is not None:
        raise TinyRLError(f"rollout.engine = auto picks vLLM on CUDA, but {reason}",
                          hint="pip install -e '.[cuda]' for vLLM, or set rollout.engine=hf to roll out with "
                          "transformers (slower; re-run `tinyrl probe-memory` for that engine)")
    log.info("rollout engine: vllm (CUDA and vLLM available)")
    return _vllm(model=model, tokenizer=tokenizer, model_path=model_path, device=device, **vllm_kwargs)


def _vllm_unusable_reason() -> str | None:
    try:
        importlib.import_module("vllm")
    except (ImportError, RuntimeError, OSError) as e:  # missing, or a build that fails to load
        return f"vLLM does not import ({e})"
    return None
