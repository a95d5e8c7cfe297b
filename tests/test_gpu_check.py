"""benchmarks/gpu_check.py, the one-command GPU check of issue 20: here (no CUDA) its reduced CPU
path must run end to end through the real Trainer and print every check's row; on a CUDA machine
the same test runs the card path on a small setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--steps", "2", "--set", "trainer.train_batch_size=4", "--set", "rollout.max_response_length=16",
         "--set", "actor.ppo_mini_batch_size=0", "--set", "critic.ppo_mini_batch_size=0"]


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_gpu_check_runs_and_reports_every_check(tmp_path, estimator):
    """GAE trains an actor and a critic; GRPO (math-grpo-4090) has no critic, and the check must
    report its actor without looking for one."""
    extra = ["--preset", "countdown-0.5b-4090", "--skip-probe"] if torch.cuda.is_available() else []
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *SMALL, *extra,
                           "--set", f"algorithm.adv_estimator={estimator}", "--set", "rollout.n=2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    critic = estimator == "gae"
    expected = [f"2 {estimator} steps", "actor_update", "rollout", "engine decode:", "actor trained: yes",
                "actor/skipped_steps 0", "all checks passed"]
    for words in expected + (["critic_update", "critic trained: yes"] if critic else []):
        assert words in out, f"{words!r} missing from:\n{out}"
    assert ("critic" in out) == critic, out
    if not torch.cuda.is_available():
        assert "no CUDA card: the reduced CPU check" in out
    assert not list(tmp_path.iterdir())  # nothing left behind in the working directory
    # the steps run in a claimed run directory, as `tinyrl train`'s: on the H200 (2026-11-29) the
    # reward worker could not open RUN_DIR/reward_prints.log, the directory not made yet
    assert "cannot write the reward function's prints" not in done.stderr, done.stderr[-3000:]


def test_no_steps_then_the_doctor_on_the_same_model(tmp_path):
    """`--steps 0 --doctor`, card_session's doctor-vllm part: the vLLM check's steps ran on the
    H200 (2026-11-29) and the doctor's rows after them were cut off; a card's minutes go to the
    doctor alone (its own two steps on the same model: on a card with vLLM, sleep/wake, what a
    sleep frees, the adapter-sync check, plan vs peak per phase)."""
    extra = ["--preset", "countdown-0.5b-4090", "--skip-probe"] if torch.cuda.is_available() else []
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *SMALL[2:], *extra,
                           "--steps", "0", "--doctor"], cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    for words in ["doctor two-step run: pass", "doctor adapter sync: pass", "doctor memory: actor_update: pass",
                  "all checks passed"]:
        assert words in out, f"{words!r} missing from:\n{out}"
    assert " steps (seconds per phase" not in out and "engine decode:" not in out, out  # no steps of its own
    assert not list(tmp_path.iterdir())


def test_the_steps_keep_the_plan_they_ran_under(tmp_path, monkeypatch):
    """On a card each step row puts a phase's peak against the plan in RUN_DIR/memory_plan.json,
    which `train` writes once the run has started; gpu_check wrote none after that moved out of
    preflight, and on the H200 (2026-11-29) every plan column read "-". The CPU makes no plan, so
    preflight's result is given one here; the steps are the real Trainer's on the tiny model."""
    import dataclasses

    import tinyrl.preflight
    from tinyrl.config import load_config
    from tinyrl.memory import versus

    gpu_check = _import_gpu_check()
    real = tinyrl.preflight.preflight
    plan = {"gpu": "a card", "budget_bytes": 3 * 2**30, "simulated": True,  # plan_dict's keys that a run keeps
            "phases": {"actor_update": {"peak_bytes": 2**30, "micro_batch": 2, "parts": {"allocator": 2**20}}}}
    monkeypatch.setattr(tinyrl.preflight, "preflight",
                        lambda cfg, run_dir: dataclasses.replace(real(cfg, run_dir), run_plan=plan))
    monkeypatch.chdir(tmp_path)
    cfg = load_config("countdown-tiny", ["trainer.device=cpu", "rollout.engine=hf", "trainer.max_steps=1",
                                         "trainer.test_every=0", "trainer.save_every=0",
                                         "trainer.train_batch_size=4", "rollout.max_response_length=8",
                                         "actor.ppo_mini_batch_size=0", "critic.ppo_mini_batch_size=0",
                                         f"data.train_path={tmp_path / 'train.parquet'}"])
    from tinyrl.doctor.trial import ensure_data

    ensure_data(cfg, tmp_path)
    gpu_check.run_steps(cfg, tmp_path / "run", 1)
    assert versus.read_run_plan(tmp_path / "run") == versus.run_plan_record(plan)


def _import_gpu_check():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return gpu_check


def test_a_role_that_did_not_move_fails_the_check():
    """roles_trained compares each trained role's tensors with the copy taken before the steps."""
    gpu_check = _import_gpu_check()
    actor, head = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.ones(3))], [torch.nn.Parameter(torch.ones(1))]
    models = SimpleNamespace(actor_parameters=lambda: actor, critic_parameters=lambda: head, with_critic=True)
    before = {role: [p.detach().clone() for p in ps] for role, ps in gpu_check.trained_tensors(models).items()}
    with torch.no_grad():
        actor[1].add_(1e-3)
    assert gpu_check.roles_trained(models, before) == [("actor", 1, 2), ("critic", 0, 1)]
    models.with_critic = False
    assert gpu_check.roles_trained(models, before) == [("actor", 1, 2)]


@pytest.mark.parametrize("preset", ["countdown-4090", "countdown-0.5b-4090", "math-grpo-4090"])
def test_every_card_presets_prompts_render_with_the_checks_model(preset, tmp_path, tiny_model_dir):
    """On an H100 (issue 31) the math-grpo-4090 check stopped before its first step: the
    random-weight model is saved with the tiny tokenizer, which has no chat template, and the
    preset renders its prompts with one. The card's overrides must let every prompt render."""
    gpu_check = _import_gpu_check()
    from tinyrl.config import load_config
    from tinyrl.doctor.trial import ensure_data
    from tinyrl.setup import prepare_inputs

    # the tiny model stands in for the random one (same tokenizer); its context is 2,048 tokens
    # (an overlong buffer must fit the shorter responses: math-grpo-4090's 512 is refused at 256)
    buffer = min(load_config(preset, check=False).algorithm.overlong_buffer, 64)
    sets = gpu_check.card_overrides(preset, str(tiny_model_dir)) + [
        "trainer.device=cpu", "rollout.max_response_length=256", "data.max_prompt_length=256",
        f"algorithm.overlong_buffer={buffer}"]
    cfg = load_config(preset, sets + ["data.generate_train_size=8"])
    ensure_data(cfg, tmp_path)
    assert prepare_inputs(cfg, tmp_path / "run").train_prompts


def test_the_steps_plan_under_the_preset_cards_budget_not_the_card_at_hands():
    """On the H200 (2026-11-28) the 3B step planned for the H200's 139 GB: its micro-batches were
    the batch's 32 rows, and its plan vs peak said nothing about the 20 rows a 4090 gets."""
    gpu_check = _import_gpu_check()
    from tinyrl.config import load_config
    from tinyrl.hardware import GPUS
    from tinyrl.memory import from_config as mp

    budget = int(21.59 * 2**30)
    sets = gpu_check.budget_override(budget, ["trainer.train_batch_size=32"])
    cfg = load_config("countdown-4090", sets, planning=True)
    plan = mp.plan_for_config(cfg, GPUS["h100"], simulate=False)  # any big card: the budget is the 4090's
    assert abs(plan.budget_bytes - budget) < 2**20 and plan.budget_bytes < 0.3 * GPUS["h100"].memory_bytes
    assert gpu_check.budget_override(budget, ["trainer.memory_budget_gib=30"]) == []  # the user's wins
