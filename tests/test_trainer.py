"""The trainer on the tiny model: packing, exact gradient accumulation, a step's metrics, export."""

from __future__ import annotations

import json

import pytest
import torch

from tinyrl.config import load_config
from tinyrl.models import make_batch
from tinyrl.phases import Phase
from tinyrl.roles import Role
from tinyrl.trainer import Trainer


def tiny_config(tmp_path, *extra: str):
    from tinyrl.data.countdown import generate_countdown

    train = tmp_path / "data" / "train.parquet"
    if not train.exists():  # a path the user sets must exist (only presets' own paths are generated)
        generate_countdown(train.parent, 256, 1024, progress=False)
    overrides = [f"data.train_path={train}",
                 "trainer.train_batch_size=8", "actor.ppo_mini_batch_size=4", "rollout.max_response_length=24",
                 "trainer.test_every=0", "trainer.save_every=0", "trainer.max_steps=2",
                 "trainer.device=cpu", *extra]  # the CPU path, on a CUDA machine too
    return load_config("countdown-tiny", overrides)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trainer")
    return Trainer(tiny_config(tmp), tmp / "run")


def test_lora_keeps_one_copy_of_the_base(trainer):
    models = trainer.models
    assert models.reference is None and models.critic_backbone is models.actor
    base = models.actor.get_base_model()
    n_base = sum(1 for n, _ in base.named_parameters() if "lora_" not in n)
    # Every base weight appears once: actor, critic and reference read the same storage.
    assert len(models.base_weight_storages()) == n_base
    # The reference is the base with adapters off: push the actor adapter away from zero and the
    # reference log-probs must not move, while the actor's do.
    batch = make_batch([[1, 2, 3, 4]], [[5, 6, 7]], pad_id=0)
    with torch.no_grad():
        ref_before = models.token_logprobs(Role.REFERENCE, batch)
        for p in models.actor_parameters():
            p.add_(0.05)
        ref_after = models.token_logprobs(Role.REFERENCE, batch)
        with models.role(Role.ACTOR):
            actor_after = models.token_logprobs(Role.ACTOR, batch)
        for p in models.actor_parameters():
            p.sub_(0.05)
    assert torch.allclose(ref_before, ref_after)
    assert not torch.allclose(actor_after, ref_after, atol=1e-4)


def test_a_step_writes_metrics(tmp_path):
    cfg = tiny_config(tmp_path)
    run = tmp_path / "run"
    history = Trainer(cfg, run).train()
    assert [m["step"] for m in history] == [1, 2]
    assert [m["epoch"] for m in history] == [1, 1]  # 1-based, as steps are (step 1 read "epoch 0")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for key in ("step", "reward/mean", "kl/mean", "response_length/mean", "timing/rollout",
                "timing/actor_update", "timing/critic_update", "memory/peak_bytes", "critic/vf_loss",
                "actor/pg_clipfrac", "training/rollout_probs_diff"):
        assert key in lines[-1], key
    assert (run / "metrics.parquet").exists() and (run / "samples.jsonl").exists()
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * cfg.trainer.log_samples
    for rec in samples:  # single-turn episodes, kept whole: one assistant turn, the completion
        assert [t["role"] for t in rec["turns"]] == ["assistant"] and rec["tool_calls"] == []
        assert rec["turns"][0]["text"] == rec["completion"] and rec["stop_reason"] in ("stop", "length")
    phases = {json.loads(x)["phase"] for x in (run / "timeline.jsonl").read_text().splitlines()}
    assert {str(p) for p in Phase} - {"validate"} <= phases
    assert json.loads((run / "config.json").read_text())["preset"] == "countdown-tiny"


@pytest.mark.parametrize("checkpointing", ["false", "true"])
def test_a_ppo_run_leaves_a_trained_critic_adapter_in_its_checkpoint(tmp_path, checkpointing):
    # What a user of countdown-tiny got before: every critic lora_B exactly 0 after 40 steps.
    from tinyrl.checkpoint import load_latest

    run = tmp_path / "run"
    Trainer(tiny_config(tmp_path, f"model.gradient_checkpointing={checkpointing}"), run).train()
    critic = load_latest(run / "checkpoints")["models"]["critic"]
    lora_b = {k: v for k, v in critic.items() if "lora_B" in k}
    lora_a = {k: v for k, v in critic.items() if "lora_A" in k}
    assert lora_b and len(lora_a) == len(lora_b)
    zero = sorted(k for k, v in lora_b.items() if not v.abs().sum() > 0)
    assert not zero, f"{len(zero)} of {len(lora_b)} critic lora_B matrices are still zero: {zero[:3]}"


@pytest.mark.parametrize("preset, quantize", [("countdown-4090", "none"), ("countdown-4090", "nf4"),
                                              ("countdown-0.5b-4090", "none"), ("countdown-grpo-4090", "nf4"),
                                              ("math-grpo-4090", "none"), ("countdown-tiny", "none")])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_vllm_engine_accepts_exactly_what_the_trainer_and_factory_pass(preset, quantize, device):
    # The keywords the trainer builds, after the factory adds LoRA serving for a peft actor, bind
    # to VLLMEngine.__init__ (an extra keyword was a TypeError on the first nf4 run).
    import inspect
    from types import SimpleNamespace

    from tinyrl.rollout.factory import vllm_engine_kwargs
    from tinyrl.rollout.vllm_engine import VLLMEngine

    cfg = load_config(preset, [f"model.quantize={quantize}", "rollout.engine=hf"])
    settings = Trainer._vllm_settings(SimpleNamespace(cfg=cfg, device=torch.device(device)))
    lora = cfg.model.finetune == "lora"
    actor = SimpleNamespace(peft_config={"actor": SimpleNamespace(r=cfg.model.lora_rank)} if lora else None)
    kwargs = vllm_engine_kwargs(actor, settings)
    assert kwargs.get("enable_lora", False) == lora
    inspect.signature(VLLMEngine.__init__).bind(None, "model-dir", object(), **kwargs)


@pytest.mark.parametrize("padding_free", ["true", "false"])
def test_training_passes_compute_no_padding(tmp_path, padding_free):
    # Mixed lengths (Countdown prompts differ in length; the untrained tiny model's responses
    # mostly run to the 24-token cap): with model.padding_free the old/ref/value passes and both
    # updates compute only real tokens; the padded layout of the same run computes padding
    # (measured 1.02 here: prompts differ by a few tokens), so the metric can tell them apart.
    m = Trainer(tiny_config(tmp_path, f"model.padding_free={padding_free}", "trainer.max_steps=1"),
                tmp_path / "run").train()[-1]
    ratios = {k: v for k, v in m.items() if k.startswith("perf/padding_ratio/")}
    assert set(ratios) == {f"perf/padding_ratio/{p}" for p in ("forward", "actor_update", "critic_update")}
    if padding_free == "true":
        assert all(v == 1.0 for v in ratios.values()), ratios  # the issue asks <= 1.05
    else:
        assert all(v > 1.0 for v in ratios.values()), ratios


def test_grpo_passes_compute_each_prompt_once_for_its_samples(tmp_path):
    # n = 4 samples of a prompt: the packed passes hold the prompt once (tinyrl.packing), so
    # they compute fewer tokens than the batch's real ones (prompts here are ~3-5x a response).
    m = Trainer(tiny_config(tmp_path, "algorithm.adv_estimator=grpo", "rollout.n=4", "algorithm.kl_in_reward=false",
                            "algorithm.use_kl_loss=true", "trainer.max_steps=1"), tmp_path / "run").train()[-1]
    ratios = {k: v for k, v in m.items() if k.startswith("perf/padding_ratio/")}
    assert set(ratios) == {"perf/padding_ratio/forward", "perf/padding_ratio/actor_update"}
    assert all(v < 0.8 for v in ratios.values()), ratios


def test_grpo_micro_batches_hold_whole_prompts_in_the_forward_and_the_update(tmp_path):
    # 8 prompts x 4 samples in one mini-batch; the budgets cap a pass at 10 rows (forward) and
    # 9 rows (update) of the planned width 256 + 24. Cut between prompts, each phase makes 4
    # passes of 2 whole prompts (as many as cutting at 10 or 9 rows), so both compute every
    # prompt once: the same tokens per real token. Before, the update's shuffled rows put most
    # prompts in every pass (0.54 against the forward's 0.29 on the demo), and rows cut at 10
    # or 9 computed 3 of the 8 prompts twice.
    m = Trainer(tiny_config(tmp_path, "algorithm.adv_estimator=grpo", "rollout.n=4", "algorithm.kl_in_reward=false",
                            "algorithm.use_kl_loss=true", "actor.ppo_mini_batch_size=8", "trainer.max_steps=1",
                            "actor.micro_batch_tokens=2520", "actor.forward_micro_batch_tokens=2800"),
                tmp_path / "run").train()[-1]
    assert m["perf/padding_ratio/actor_update"] == m["perf/padding_ratio/forward"] < 0.8, m


def test_val_before_train_logs_step_zero_and_the_last_step_always_validates(tmp_path):
    # test_every=5 with 2 steps: without the last-step rule there would be no "after" at all
    import io

    from rich.console import Console

    from tinyrl.dashboard import Dashboard

    cfg = tiny_config(tmp_path, "trainer.test_every=5", "trainer.val_before_train=true", "data.max_test_prompts=4")
    run = tmp_path / "run"
    shown = io.StringIO()
    trainer = Trainer(cfg, run, dashboard=Dashboard({"total_steps": 2}, mode="plain", console=Console(file=shown)))
    history = trainer.train()
    assert [m["step"] for m in history] == [1, 2]  # step 0 is a validation, not a training step
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    assert set(lines[0]) == {"step", "val/score", "val/reward_mean", "val/prompts"} and trainer.val_before == lines[0]
    assert lines[0]["val/prompts"] == lines[2]["val/prompts"] == 4  # data.max_test_prompts: what val/score is out of
    assert "val/score" not in lines[1] and "val/score" in lines[2]
    # the step-0 score is on step 1's line (it said "val –" until the run's last step)
    step1 = next(x for x in shown.getvalue().splitlines() if x.startswith("step 1/2"))
    assert f"| val {lines[0]['val/score']:.3f} |" in step1, step1


def test_critic_warmup_holds_the_actor_while_the_critic_learns(tmp_path):
    # verl's trainer.critic_warmup = 3: steps 1 and 2 update the critic only, step 3 both.
    trainer = Trainer(tiny_config(tmp_path, "trainer.critic_warmup=3", "trainer.max_steps=3"), tmp_path / "run")
    models = trainer.models

    def snapshot(params):
        return [p.detach().clone() for p in params]

    def moved(before, params):
        return any(not torch.equal(b, p) for b, p in zip(before, params))

    critic_start = snapshot(models.critic_parameters())
    for step in (1, 2, 3):
        actor = snapshot(models.actor_parameters())
        metrics = trainer.train_step()
        assert "critic/vf_loss" in metrics, step  # the critic learner ran every step
        assert moved(actor, models.actor_parameters()) == (step == 3), step
        assert ("actor/pg_loss" in metrics) == (step == 3), step
        if step == 2:  # (a step whose rewards are all 0 gives a zero-initialised critic no gradient)
            assert moved(critic_start, models.critic_parameters())


@pytest.mark.parametrize("kl, coef", [(["algorithm.kl_in_reward=true", "algorithm.kl_coef=0.02"], 0.02),
                                      (["algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=0.05"], 0.05),
                                      (["algorithm.kl_in_reward=true", "algorithm.kl_coef=0.02",
                                        "algorithm.kl_ctrl=adaptive"], 0.02),  # the step's own, not the next one's
                                      ([], None)])
def test_kl_coef_is_the_coefficient_the_run_applies(tmp_path, kl, coef):
    """kl/coef (the dashboard's and the plain line's "coef", report's beta) was the in-reward
    controller's value in every run: 0.001 beside a KL loss weighted 0.05, and in a run without KL."""
    m = Trainer(tiny_config(tmp_path, "algorithm.adv_estimator=grpo", "rollout.n=2", "algorithm.kl_in_reward=false",
                            "trainer.train_batch_size=4", "actor.ppo_mini_batch_size=4", "trainer.max_steps=1", *kl),
                tmp_path / "run").train()[-1]
    assert m.get("kl/coef") == coef


def test_the_logged_learning_rate_is_the_one_the_step_used(tmp_path):
    """actor/lr and critic/lr were read after the scheduler stepped: with warm-up, step 1 logged
    step 2's rate (2/4 of the peak where 1/4 was used) and the curve was one step early."""
    history = Trainer(tiny_config(tmp_path, "actor.lr=4e-3", "critic.lr=4e-3", "actor.warmup_steps=4",
                                  "critic.warmup_steps=2", "trainer.max_steps=2"), tmp_path / "run").train()
    assert [m["actor/lr"] for m in history] == pytest.approx([1e-3, 2e-3])
    assert [m["critic/lr"] for m in history] == pytest.approx([2e-3, 4e-3])
