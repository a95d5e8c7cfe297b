"""One-command GPU check (issue 20): what a CUDA card really does with a preset, against the plan.

    python benchmarks/gpu_check.py                          # countdown-4090 (3B LoRA), 2 PPO steps
    python benchmarks/gpu_check.py --preset countdown-0.5b-4090 --steps 3
    python benchmarks/gpu_check.py --skip-probe --set trainer.train_batch_size=8

On a CUDA card: a random-weight model of the preset's architecture is built from
tinyrl/model_specs (no download; memory and speed do not depend on the weights, rewards do) and
saved with the tiny tokenizer; then
  1. the plan: simulated (fake tensors) vs the real probe, micro-batch per training phase and
     their ratio, under the budget of the preset's own card (--budget to change it);
  2. --steps RL steps (the preset's estimator; 0: none) through the real Trainer, planned under the same
     budget (trainer.memory_budget_gib, unless --set gives one): seconds and peak allocated memory
     per phase against the plan (tinyrl.memory.versus);
  3. the HF engine's decode rate (tokens/s of one timed generate call after training);
  4. each role the algorithm trains changed: the actor's trainable tensors, and with a critic
     (GAE) the critic's and its value head, against a copy taken before the first step, under a
     text-hash reward (check_reward: random weights never earn the task's); a GRPO preset has
     no critic to check;
  5. optimizer steps skipped because the gradient norm was not finite (should be 0);
  6. with --doctor, tinyrl doctor's rows on the same model (its trial runs the configured engine:
     with rollout.engine=vllm, sleep/wake times, what a sleep frees, the adapter-sync check).
Exit 1 when a check fails. Without CUDA it runs the reduced CPU version (countdown-tiny, the tiny
model, fp32, no probe), which shows the script works, not what any card does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tinyrl  # noqa: F401  (before transformers/peft)
import torch

from tinyrl.config import layered, load_config
from tinyrl.errors import TinyRLError
from tinyrl.hardware import detect_gpu, get_gpu
from tinyrl.memory import from_config as mp
from tinyrl.memory import versus
from tinyrl.memory.probe import free_memory

GiB = 2**30
ROOT = Path(__file__).resolve().parents[1]


def check_reward(completion: str, example) -> float:
    """A reward that varies with the text (random weights never solve the task, and all-zero
    rewards with an untrained critic give zero returns and advantages: nothing would train, so
    the critic check would prove nothing). Pseudo-random in [0, 1), the same for the same text."""
    return (sum(map(ord, completion)) % 97) / 97


def build_random_model(model_name: str, out: Path) -> str:
    """A bf16 Qwen2 of `model_name`'s shipped architecture with random weights, saved with the tiny
    tokenizer (its ids lie inside Qwen's vocabulary). Random weights rarely stop: every response
    runs to max length, the worst case for memory."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from tinyrl.memory.simulate import default_dtype, qwen2_config
    from tinyrl.model_specs import load_spec
    from tinyrl.tiny_model import build_tiny_model

    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    config = qwen2_config(load_spec(model_name))
    config.use_cache = True
    with torch.device("cuda"), default_dtype(torch.bfloat16):
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return str(out)


def card_overrides(preset: str, model_dir: str) -> list[str]:
    """The preset on the card with the random-weight model build_random_model saved. That model
    carries the tiny tokenizer, which has no chat template: a chat preset (math-grpo-4090) gets
    the hermes template the tiny tool demo uses, as a user with a base model would set one (the
    preset's instruct model brings its own). Without it the check stopped at the first prompt."""
    sets = ["trainer.device=cuda", "rollout.engine=hf", f"model.name={model_dir}"]
    cfg = load_config(preset)
    if cfg.data.chat_template and not cfg.model.custom_chat_template:
        sets.append(f"model.custom_chat_template={ROOT / 'presets' / 'chat_templates' / 'tiny-hermes.jinja'}")
    return sets


def plan_rows(cfg, budget_bytes: int) -> tuple[list[tuple], list[str]]:
    """-> ((phase, simulated micro-batch, measured micro-batch, simulated / measured) rows, the
    real probe's own notes: where the size it found did not run again)."""
    card = detect_gpu()
    simulated = mp.plan_for_config(cfg, card, simulate=True, budget_bytes=budget_bytes)
    measured = mp.cuda_probe(cfg, card, simulated)
    rows = []
    for name in mp.TRAINING_PHASES:
        if name in simulated.phases:
            s, m = simulated.phases[name].micro_batch, measured.phases[name].micro_batch
            rows.append((name, s, m, s / m if m else float("inf")))
    return rows, [n for n in measured.notes if n.startswith(mp.PROBE_NOTE)]


def budget_override(budget_bytes: int, user_sets: list[str]) -> list[str]:
    """The steps plan under the preset's card's budget, not the card at hand's: on the H200
    (2026-11-28) the 3B step planned for 139 GB, its micro-batches were the batch's 32 rows, and
    plan vs peak said nothing about the 20 a 4090 gets. A --set of the key wins."""
    if any(item.startswith("trainer.memory_budget_gib=") for item in user_sets):
        return []
    return [f"trainer.memory_budget_gib={budget_bytes / GiB:.4f}"]


def run_steps(cfg, run_dir: Path, steps: int):
    """-> (trainer, history, {role: its trainable tensors before the first step, on the host})"""
    from tinyrl import rundir
    from tinyrl.start import start_run

    # as `train` (tinyrl.cli.run): a claimed run directory, then the one start sequence (preflight,
    # whose plan fills the micro-batch budgets on CUDA; the trainer; the plan kept beside the run,
    # which the step rows' plan columns read)
    with rundir.claim(run_dir, "gpu_check"):
        trainer = start_run(cfg, run_dir).trainer
        before = {role: [p.detach().to("cpu", copy=True) for p in params]
                  for role, params in trained_tensors(trainer.models).items()}
        history = trainer.train(steps)
    return trainer, history, before


def decode_rate(trainer, cfg) -> tuple[str, float]:
    """(engine name, tokens/s of one timed generate call of the step's prompts)."""
    from tinyrl.rollout.base import SamplingSettings

    prompts = trainer.inputs.train_prompts[:cfg.trainer.train_batch_size]
    sampling = SamplingSettings(n=cfg.rollout.n, temperature=1.0, top_p=1.0,
                                max_new_tokens=cfg.rollout.max_response_length, seed=1)
    trainer.engine.wake(trainer.models.actor)
    start = time.perf_counter()
    result = trainer.engine.generate(prompts, sampling)
    seconds = time.perf_counter() - start
    trainer.engine.sleep()
    return trainer.engine.name, sum(len(c.response_ids) for c in result.episodes) / seconds


def trained_tensors(models) -> dict[str, list]:
    """The tensors each role the run trains owns (the critic's include its value head)."""
    out = {"actor": models.actor_parameters()}
    if models.with_critic:
        out["critic"] = models.critic_parameters()
    return out


def roles_trained(models, before: dict[str, list]) -> list[tuple[str, int, int]]:
    """(role, tensors that changed since `before`, tensors) per trained role. LoRA's A matrices
    get no gradient while B is still 0, so after one step only the B half may have moved."""
    rows = []
    for role, params in trained_tensors(models).items():
        changed = sum(not torch.equal(p.detach().cpu(), old) for p, old in zip(params, before[role]))
        rows.append((role, changed, len(params)))
    return rows


def report_steps(cfg, run_dir: Path, steps: int, cuda: bool) -> list[str]:
    """Checks 2-5: the steps through the real Trainer, printed as measured -> what failed."""
    failed = []
    trainer, history, before = run_steps(cfg, run_dir, steps)
    last = history[-1]
    rows = versus.compare(versus.read_run_plan(run_dir),
                          versus.measured_peaks(list(_timeline(run_dir))))
    peaks = {r["phase"]: r for r in rows}
    # three decimals: the 0.5B's forward and rollout were 0.07 and 0.05 GiB above the plan at two
    # (H100 and H200 alike), too close to the rounding to say by how much
    what = "peak allocated GiB vs planned" if cuda else "CPU: the process's RSS high-water mark, GiB"
    say(f"{steps} {cfg.algorithm.adv_estimator} steps (seconds per phase, mean; {what}):")
    for key in sorted(k for k in last if k.startswith("timing/") and k != "timing/step"):
        phase = key.split("/", 1)[1]
        secs = sum(h.get(key, 0.0) for h in history) / len(history)
        r = peaks.get(phase, {})
        peak = "-" if r.get("measured") is None else f"{r['measured'] / GiB:.3f}"
        plan = "-" if r.get("planned") is None else f"{r['planned'] / GiB:.3f}"
        # the allocator's side: what the card reserved against the plan with its headroom blocks
        held = "-" if not r.get("reserved") else f"{r['reserved'] / GiB:.3f}"
        room = "-" if r.get("planned_reserved") is None else f"{r['planned_reserved'] / GiB:.3f}"
        say(f"  {phase:<14} {secs:>8.2f} s   peak {peak:>7}   plan {plan:>7}   reserved {held:>7}   "
            f"plan+headroom {room:>7}")
    engine, rate = decode_rate(trainer, cfg)
    say(f"{engine} engine decode: {rate:,.0f} tokens/s")
    for role, changed, total in roles_trained(trainer.models, before):
        say(f"{role} trained: {'yes' if changed else 'NO'} ({changed} of its {total} tensors changed)")
        if not changed:
            failed.append(f"the {role} did not train")
    skips = {k: int(v) for k, v in last.items() if k.endswith("/skipped_steps")}
    say("non-finite skips: " + (", ".join(f"{k} {v}" for k, v in skips.items()) or "none recorded"))
    if any(skips.values()):
        failed.append("optimizer steps were skipped for a non-finite gradient norm")
    trainer.engine.close()
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="countdown-4090")
    ap.add_argument("--steps", type=int, default=2,
                    help="RL steps through the real Trainer (0: none, the plan and/or --doctor only)")
    ap.add_argument("--budget", type=float, default=None, help="GiB; default: 90%% of the preset's card")
    ap.add_argument("--skip-probe", action="store_true", help="no real probe (it takes minutes on a 3B)")
    ap.add_argument("--doctor", action="store_true",
                    help="then tinyrl doctor's rows on the same model (with --set rollout.engine=vllm: sleep and "
                         "wake times, what a sleep frees, the adapter-sync check)")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config override key=value")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    work = Path(tempfile.mkdtemp(prefix="tinyrl-gpu-check-"))
    failed = []
    try:
        if cuda:
            preset = args.preset
            model_dir = build_random_model(load_config(preset).model.name, work / "model")
            sets = card_overrides(preset, model_dir)
            say(f"card: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
                f"cuDNN {torch.backends.cudnn.version()}; random-weight {preset} model in {model_dir}")
        else:
            preset, sets = "countdown-tiny", ["trainer.device=cpu", "rollout.engine=hf"]
            say("no CUDA card: the reduced CPU check (countdown-tiny, tiny model, fp32, no probe). "
                "It shows the script runs; the figures say nothing about a card.")
        small = [f"trainer.max_steps={max(args.steps, 1)}", "trainer.test_every=0", "trainer.save_every=0",
                 f"reward.fn={Path(__file__).resolve()}:check_reward"]
        cfg = load_config(preset, sets + small + args.sets)
        budget = int((args.budget or 0.9 * get_gpu(cfg.cost.gpu).memory_bytes / GiB) * GiB)
        if cuda and (pinned := budget_override(budget, args.sets)):
            cfg = load_config(preset, sets + small + pinned + args.sets)
        from tinyrl.doctor.trial import ensure_data

        ensure_data(cfg, work)
        if cuda and not args.skip_probe:
            say(f"plan vs real probe (budget {budget / GiB:.2f} GiB):")
            say(f"  {'phase':<14} {'simulated':>9} {'measured':>9} {'sim/real':>8}")
            try:
                rows, notes = plan_rows(cfg, budget)
            except (TinyRLError, RuntimeError) as exc:  # the steps below still say what the trainer does
                rows, notes = [], []
                say(f"  the real probe failed: {type(exc).__name__}: {str(exc)[:500]}")
                failed.append("the real probe failed")
                free_memory()
            for name, s, m, ratio in rows:
                say(f"  {name:<14} {s:>9} {m:>9} {ratio:>8.2f}")
                if s > m:
                    failed.append(f"{name}: the plan promises {s} sequences, the card held {m}")
            for note in notes:
                say(f"  {note}")
        if args.steps:
            failed += report_steps(cfg, work / "run", args.steps, cuda)
        if args.doctor:
            free_memory()  # the doctor's child gets the card without the steps' models and cache
            failed += doctor_rows(preset, layered(sets, args.sets), work)  # a command line: each key once
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("FAILED: " + "; ".join(failed) if failed else "all checks passed")
    return 1 if failed else 0


def doctor_rows(preset: str, overrides: list[str], work: Path) -> list[str]:
    """`tinyrl doctor` on the check's model and overrides, in a child process (one vLLM engine
    a process, as tinyrl's own tests run it: a second engine in this one would see what the
    first left on the card), one line a row. -> the failed rows."""
    report_file = work / "doctor.json"
    cmd = [sys.executable, "-m", "tinyrl.cli", "doctor", "--preset", preset, "--json", "--out", str(report_file)]
    # the child imports tinyrl as this process did (installed, or the PYTHONPATH it inherits)
    done = subprocess.run(cmd + [a for o in overrides for a in ("--set", o)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if not report_file.is_file():
        say(f"doctor: no report (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return ["doctor: it did not finish"]
    report = json.loads(report_file.read_text())
    for row in report["rows"]:
        say(f"doctor {row['name']}: {row['status']}, {row['found'] or row['reason']}"
            + (f" (fix: {row['fix']})" if row["fix"] else ""))
    return [f"doctor: {name} failed" for name in report["failed"]]


def say(line: str) -> None:
    """Each finding as soon as it is known (flushed): a check cut off by a time limit on a card
    keeps what it had measured. The trainer logs to stderr, so stdout holds the findings only."""
    print(line, flush=True)


def _timeline(run_dir: Path):
    from tinyrl.jsonl import read_records

    path = run_dir / "timeline.jsonl"
    return read_records(path) if path.is_file() else []


if __name__ == "__main__":
    sys.exit(main())
