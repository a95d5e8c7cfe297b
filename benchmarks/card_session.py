"""Issue 31's card measurements as one device call, most important first, inside a time budget.

    python benchmarks/card_session.py --out "$OUT" --seconds 540
    python benchmarks/card_session.py --out "$OUT" --only check-3b --only pytest-fast

A lent card comes with minutes, not hours (GPU.md: a 3B probe takes ~160 s, a 3B step ~160 s),
so the parts run in order, what is still unmeasured first; each is its own process whose
timeout is what is left of --seconds, writing OUT/NN-PART.txt as it goes (benchmarks/gpu_check.py
prints each finding when it has it: a part cut off keeps what it measured). OUT/summary.txt gets
one line per part: exit status and seconds, "cut off", or "not started" once the budget is spent.
Parts (--only picks some, in this order: what is still unmeasured first, 2026-11-30):
  versions      python, torch + CUDA + cuDNN, transformers, peft, the card, nvidia-smi
  doctor-vllm   gpu_check countdown-0.5b-4090 with rollout.engine=vllm, no steps of its own, then
                the doctor's rows on that model: sleep/wake seconds, what a sleep frees, the
                adapter-sync check, plan vs peak per phase (not started where vllm does not
                import: GPU.md's bundle brings vLLM 0.26). check-vllm's steps ran on 2026-11-29
                and cut these off
  test-oom      pytest tests/test_oom.py -rA: each child's address-space figures, and what the
                fork left out (parent_peak_above_size), printed pass or fail
  check-3b      gpu_check countdown-4090, 1 step of 32 prompts (3B LoRA actor + critic: the first
                run README gives; the preset's 256 x 1,024-token rollout alone would outlast a lent
                card's minutes on the HF engine, GPU.md: 142 s for 32 rows), no real probe: its
                plan against the probe matched on 2026-11-28 and -29, and both runs were cut off
                before the step
  check-0.5b    gpu_check countdown-0.5b-4090, 2 steps as the preset has them (full fine-tune)
  check-vllm    gpu_check countdown-0.5b-4090, 3 steps with rollout.engine=vllm, then the doctor
  check-math    gpu_check math-grpo-4090, 1 step of 4 prompts x 8 (GRPO, no critic), no real probe
  pytest-fast   pytest -m "not vllm and not slow" -n 14 (the suite without the CPU demos), each
                failure's traceback printed when it fails (benchmarks/failures_now.py)
A smaller batch keeps the widths traced but caps every planned micro-batch at the batch's rows
and holds fewer rows in the rollout at once; the plan and the probe see the same overrides, so
plan vs card stays a fair comparison, of a smaller setting than the preset's.
Exit 0 when every part that ran exited 0; the vLLM measurements need GPU.md's bundle first.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
CHECK = str(ROOT / "benchmarks" / "gpu_check.py")
VERSIONS = """
import shutil, subprocess, sys
import tinyrl  # before transformers and peft, as every tinyrl entry point
import peft, torch, transformers
print(sys.version)
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("transformers", transformers.__version__, "peft", peft.__version__)
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(0), "free/total bytes", torch.cuda.mem_get_info())
if shutil.which("nvidia-smi"):
    subprocess.run(["nvidia-smi"], check=False)
"""
VLLM_05B = [PY, CHECK, "--preset", "countdown-0.5b-4090", "--skip-probe", "--set", "rollout.engine=vllm", "--doctor"]
PARTS: list[tuple[str, list[str]]] = [
    ("versions", [PY, "-c", VERSIONS]),
    ("doctor-vllm", VLLM_05B + ["--steps", "0"]),
    ("test-oom", [PY, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "tests/test_oom.py"]),
    ("check-3b", [PY, CHECK, "--preset", "countdown-4090", "--steps", "1", "--skip-probe",
                  "--set", "trainer.train_batch_size=32",
                  "--set", "actor.ppo_mini_batch_size=32", "--set", "critic.ppo_mini_batch_size=32"]),
    ("check-0.5b", [PY, CHECK, "--preset", "countdown-0.5b-4090", "--steps", "2"]),
    ("check-vllm", VLLM_05B + ["--steps", "3"]),
    # no real probe: the 3B check has one, and a lent card's minutes go to the GRPO step itself
    ("check-math", [PY, CHECK, "--preset", "math-grpo-4090", "--steps", "1", "--skip-probe",
                    "--set", "trainer.train_batch_size=4",
                    "--set", "actor.ppo_mini_batch_size=4"]),
    # -v: a line per test as it ends, and failures_now each failure's traceback when it fails, so a
    # part cut off at the budget still names its failures and shows why
    ("pytest-fast", [PY, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "benchmarks.failures_now",
                     "-m", "not vllm and not slow", "-n", "14", "tests"]),
]
MIN_SECONDS = 20  # a part given less than this could not even import torch: not started


def run_parts(parts: list[tuple[str, list[str]]], out: Path, seconds: float) -> list[str]:
    """Run each part in order until `seconds` are spent. -> the summary lines (also in
    out/summary.txt, rewritten after every part so a cut-off call still has it)."""
    out.mkdir(parents=True, exist_ok=True)
    # the checkout first, then what was there (GPU.md's vLLM bundle lives on PYTHONPATH: /tmp/site)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    deadline, summary = time.monotonic() + seconds, []
    for i, (name, cmd) in enumerate(parts, 1):
        left = deadline - time.monotonic()
        if left < MIN_SECONDS:
            summary.append(f"{name}: not started ({left:.0f} s of the budget left)")
        elif "rollout.engine=vllm" in cmd and importlib.util.find_spec("vllm") is None:
            summary.append(f"{name}: not started (vllm does not import here; GPU.md says how to bring it)")
        else:
            start = time.monotonic()
            with open(out / f"{i:02d}-{name}.txt", "w") as log:
                # its own process group: a cut-off part's children (pytest workers) go with it
                proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
                try:
                    verdict = f"exit {proc.wait(timeout=left)}"
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    verdict = "cut off at the budget"
            summary.append(f"{name}: {verdict}, {time.monotonic() - start:.0f} s")
        print(summary[-1], flush=True)
        (out / "summary.txt").write_text("\n".join(summary) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the parts' outputs ($OUT on the device)")
    ap.add_argument("--seconds", type=float, default=540, help="budget for all parts together (default 540)")
    ap.add_argument("--only", action="append", default=[], choices=[name for name, _ in PARTS],
                    help="run only these parts (repeat it)")
    args = ap.parse_args(argv)
    parts = [(name, cmd) for name, cmd in PARTS if not args.only or name in args.only]
    return 0 if all_ran_clean(run_parts(parts, args.out, args.seconds)) else 1


def all_ran_clean(summary: list[str]) -> bool:
    """Every part that started exited 0 (one cut off at the budget did not)."""
    return all(": exit 0," in line for line in summary if "not started" not in line)


if __name__ == "__main__":
    sys.exit(main())
