"""Does this Python import what tinyrl's vLLM engine runs? (issue 31: vLLM on a lent card)

    PYTHONPATH=/tmp/site python3 benchmarks/vllm_imports.py          # on the card: every module
    PYTHONPATH=/tmp/site python3 benchmarks/vllm_imports.py --no-driver   # a machine without one

`import vllm` alone proves little: vLLM loads most of itself lazily, and a bundle that passed it
(../shared/gpu/vllm-bundle.sh's own check) failed `from vllm import LLM` (2026-11-28, vLLM 0.26.0:
cloudpickle, aiohttp, tiktoken and xgrammar were missing). This imports the modules the engine's
LLM, engine core, GPU worker, model runner, Qwen2 model, LoRA layers, flash-attention backend,
sampler and sleep-mode allocator live in, each on its own, and prints one line per module.
Exit 0 when all import; 1 when one does not, naming the missing Python module (the package to
add) or the error. --no-driver: an ImportError for libcuda.so.1 (the NVIDIA driver, which only
a card has) counts as expected, so the bundle can be checked on a CPU machine with Python 3.12
and torch 2.11.0 installed beside it (how it was checked here).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

MODULES = (
    "vllm", "vllm.entrypoints.llm", "vllm.inputs", "vllm.sampling_params", "vllm.lora.request",
    "vllm.distributed.parallel_state", "vllm.model_executor.models.registry", "vllm.platforms",
    "vllm.v1.engine.core", "vllm.v1.engine.llm_engine", "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner", "vllm.model_executor.models.qwen2", "vllm.lora.worker_manager",
    "vllm.lora.layers", "vllm.lora.punica_wrapper.punica_gpu", "vllm.v1.attention.backends.flash_attn",
    "vllm.vllm_flash_attn", "vllm.v1.sample.sampler", "vllm.device_allocator.cumem", "vllm.config",
)
DRIVER_ONLY = ("libcuda.so.1", "requires the CUDA flash attention extensions")  # what a CPU machine lacks


def missing_module(exc: ModuleNotFoundError) -> str | None:
    """The module really missing: vLLM's lazy loaders and transformers re-raise without a name."""
    seen = exc
    while getattr(seen, "name", None) is None and (seen.__cause__ or seen.__context__) is not None:
        seen = seen.__cause__ or seen.__context__
    return getattr(seen, "name", None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-driver", action="store_true",
                        help="no NVIDIA driver here: libcuda.so.1 errors are expected, not failures")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    failed = 0
    for name in MODULES:
        try:
            importlib.import_module(name)
            print(f"ok       {name}")
        except ModuleNotFoundError as exc:
            failed += 1
            print(f"MISSING  {name}: no module {missing_module(exc)!r} (add its package to the bundle)")
        except Exception as exc:  # noqa: BLE001 -- each module's own failure is the finding
            text = f"{type(exc).__name__}: {str(exc)[:300]}"
            if args.no_driver and any(s in str(exc) for s in DRIVER_ONLY):
                print(f"no-card  {name}: {text}")
            else:
                failed += 1
                print(f"ERROR    {name}: {text}")
    print(f"{len(MODULES) - failed} of {len(MODULES)} modules import"
          + (" (driver-only errors allowed)" if args.no_driver else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
