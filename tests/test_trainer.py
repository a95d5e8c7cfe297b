"""The trainer on the tiny model: packing, exact gradient accumulation, a step's metrics, export."""

from __future__ import annotations

import json

import pytest
import torch

from tinyrl.config import load_config
from tinyrl.models import make_batch
from tinyrl.trainer import Trainer


def tiny_config(tmp_path, *extra: str):
    from tinyrl.data.countdown import generate_countdown

    train = tmp_path / "data" / "train.parquet"
    if not train.exists():  # a path the user sets must exist (only presets' own paths are generated)
        generate_countdown(train.parent, 256, 1024, progress=False)
    overrides = [f"data.train_path={train}",
                 "trainer.train_batch_size=8", "actor.ppo_mini_batch_size=4", "rollout.max_response_length=24",
                 "trainer.test_every=0", "trainer.save_every=0", "trainer.max_steps=2", *extra]
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
        ref_before = models.token_logprobs("reference", batch)
        for p in models.actor_parameters():
            p.add_(0.05)
        ref_after = models.token_logprobs("reference", batch)
        actor_after = models.token_logprobs("actor", batch)
        for p in models.actor_parameters():
            p.sub_(0.05)
    assert torch.allclose(ref_before, ref_after)
    assert not torch.allclose(actor_after, ref_after, atol=1e-4)


def _mini_batch(trainer):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 200, (int(n),), generator=g).tolist() for n in (5, 9, 7, 6)]
    responses = [torch.randint(3, 200, (int(n),), generator=g).tolist() for n in (4, 11, 2, 8)]
    batch = make_batch(prompts, responses, pad_id=0)
    B, R = batch.response_mask.shape
    with torch.no_grad():
        old = trainer.models.token_logprobs("actor", batch) - 0.05 * torch.rand(B, R, generator=g)
        values = trainer.models.values(batch) + 0.1 * torch.randn(B, R, generator=g)
    return {"batch": batch, "old_lp": old, "ref_lp": old - 0.01, "adv": torch.randn(B, R, generator=g),
            "returns": torch.randn(B, R, generator=g), "values": values}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("is_actor", [True, False])
def test_one_micro_batch_and_four_give_the_same_gradient(trainer, agg, is_actor):
    trainer.cfg.actor.loss_agg_mode = agg
    mini = _mini_batch(trainer)
    params = trainer.models.actor_parameters() if is_actor else trainer.models.critic_parameters()

    def grads(slices):
        for p in params:
            p.grad = None
        trainer.accumulate_gradients(is_actor, mini, slices)
        return [p.grad.clone() for p in params if p.grad is not None]

    one = grads([slice(0, 4)])
    four = grads([slice(i, i + 1) for i in range(4)])
    assert len(one) == len(four) > 0
    assert any(g.abs().sum() > 0 for g in one)
    for a, b in zip(one, four):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    trainer.cfg.actor.loss_agg_mode = "token-mean"


def test_a_step_writes_metrics(tmp_path):
    cfg = tiny_config(tmp_path)
    run = tmp_path / "run"
    history = Trainer(cfg, run).train()
    assert [m["step"] for m in history] == [1, 2]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for key in ("step", "reward/mean", "kl/mean", "response_length/mean", "timing/rollout",
                "timing/actor_update", "timing/critic_update", "memory/peak_bytes", "critic/vf_loss",
                "actor/pg_clipfrac", "training/rollout_probs_diff"):
        assert key in lines[-1], key
    assert (run / "metrics.parquet").exists() and (run / "samples.jsonl").exists()
    phases = {json.loads(x)["phase"] for x in (run / "timeline.jsonl").read_text().splitlines()}
    assert {"rollout", "ref_old_logprobs", "values", "actor_update", "critic_update", "checkpoint"} <= phases
    assert json.loads((run / "config.json").read_text())["preset"] == "countdown-tiny"
