"""Inserted tokens (policy_mask 0: a tool's output) are context, never trained on.

Episodes with an inserted span in the middle go through the trainer's own code: Episode ->
trajectory_of -> Trainer._advantages (KL in the reward, the estimator, the rollout IS weights)
-> the actor and critic learners' loss functions and micro-batch weighting -> the parity guard's
probs_diff. Two invariants, for every estimator and loss aggregation mode:
- garbage at the inserted positions (log-probs, entropy, values, engine log-probs) changes no
  output bit, and every gradient at those positions is exactly 0;
- the numbers equal those of the same episodes with the inserted tokens deleted (all-ones
  masks): an inserted token counts in no normaliser, no sequence length and no GAE step.
The real-model test: ids of an inserted span changed after the last policy token (where they
cannot be context for any trained token) leave both losses and every trainable parameter's
gradient exactly unchanged.
"""

from __future__ import annotations

import pytest
import torch

from tinyrl.config import load_config
from tinyrl.learners import Learner, actor_loss_fn, critic_loss_fn
from tinyrl.microbatch import BudgetKeeper
from tinyrl.models import PolicyModels
from tinyrl.phases import Phase
from tinyrl.rl import kl as klmod
from tinyrl.rl.rollout_is import probs_diff
from tinyrl.roles import Role
from tinyrl.rollout.base import Episode, Turn
from tinyrl.trainer import Trainer
from tinyrl.trajectory import engine_logprobs, trajectory_of

MASKS = [[1, 1, 1, 0, 0, 0, 1, 1],   # a tool turn in the middle
         [1, 1, 0, 0, 1],
         [1, 1, 1, 1],                # single-turn
         [1, 0, 0, 1, 1, 1]]
AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
ESTIMATORS = ["gae", "grpo", "rloo", "reinforce_pp"]


def _episode(i: int, ids: list[int], mask: list[int], lps: list[float]) -> Episode:
    turns, start = [], 0
    for k in range(1, len(mask) + 1):  # one turn per run of equal mask values
        if k == len(mask) or mask[k] != mask[start]:
            turns.append(Turn("assistant" if mask[start] else "tool", start, k))
            start = k
    return Episode(i // 2, [5 + i, 6, 7], ids, mask, lps, turns, "stop")


def _config(estimator: str, agg: str):
    return load_config("countdown-tiny", [
        f"algorithm.adv_estimator={estimator}", "algorithm.kl_in_reward=true", "algorithm.kl_coef=0.1",
        "algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=0.1", "algorithm.kl_loss_type=k3",
        "algorithm.rollout_is=token", "algorithm.gamma=0.9", "algorithm.lam=0.8",
        f"actor.loss_agg_mode={agg}", f"critic.loss_agg_mode={agg}", "actor.entropy_coeff=0.01",
        "trainer.train_batch_size=2", "rollout.n=2"], check=False)


class _FakeModels:
    """The trainer's model interface, answering with fixed per-token tensors (leaves that
    require grad), looked up by row so any micro-batch split works."""

    def __init__(self, batch, lp, ent, values):
        self.ids = batch.input_ids
        self.lp, self.ent, self.v = lp, ent, values

    def _rows(self, batch):
        return [next(i for i in range(len(self.ids)) if torch.equal(self.ids[i], row)) for row in batch.input_ids]

    def token_logprobs(self, role, batch, temperature, with_entropy=False):
        r = self._rows(batch)
        return (self.lp[r], self.ent[r]) if with_entropy else self.lp[r]

    def values(self, batch):
        return self.v[self._rows(batch)]


def _run(estimator: str, agg: str, per_token: dict[str, list[list[float]]], masks, ids):
    """Everything the trainer computes from a rollout, through its own functions. -> (outputs, grads)"""
    cfg = _config(estimator, agg)
    episodes = [_episode(i, ids[i], masks[i], per_token["rollout"][i]) for i in range(len(masks))]
    traj = trajectory_of(episodes, pad_id=0, device=torch.device("cpu"))
    B, R = traj.mask.shape

    def pad(rows):  # [B, R], padding 0
        return torch.tensor([r + [0.0] * (R - len(r)) for r in rows])

    traj.rollout_lp = engine_logprobs(episodes, traj.mask)
    traj.old_lp, traj.ref_lp, traj.values = pad(per_token["old"]), pad(per_token["ref"]), pad(per_token["values"])
    traj.scores = torch.tensor([1.0, 0.2, 0.5, -0.3])
    trainer = Trainer.__new__(Trainer)  # only what ADVANTAGES reads
    trainer.cfg, trainer.rollout_is = cfg, "token"
    trainer.kl_ctrl = klmod.make_kl_controller("fixed", cfg.algorithm.kl_coef, 0.0, 1)
    kl_metrics = trainer._advantages(traj)

    lp, ent, v = (pad(per_token[k]).requires_grad_() for k in ("lp", "ent", "new_values"))
    models = _FakeModels(traj.batch, lp, ent, v)
    budgets = BudgetKeeper({Phase.ACTOR_UPDATE: 1 << 20, Phase.CRITIC_UPDATE: 1 << 20})
    dummy = [torch.nn.Parameter(torch.zeros(1))]
    splits = [slice(0, 1), slice(1, 3), slice(3, 4)]  # micro-batches: weights must count policy tokens
    stats = {}
    for phase, section, fn in ((Phase.ACTOR_UPDATE, cfg.actor, actor_loss_fn(cfg)),
                               (Phase.CRITIC_UPDATE, cfg.critic, critic_loss_fn(cfg))):
        learner = Learner(str(phase), phase, section, models, dummy, fn, budgets)
        stats.update({f"{phase}/{k}": v for k, v in learner.accumulate_gradients(traj, splits).items()})
    out = {"advantages": traj.advantages, "returns": traj.returns, "is_weights": traj.is_weights,
           "probs_diff": probs_diff(traj.old_lp, traj.rollout_lp, traj.mask),
           **{k: torch.tensor(float(x)) for k, x in {**kl_metrics, **stats}.items()}}
    return out, {"lp": lp.grad, "ent": ent.grad, "values": v.grad}, traj.mask


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    per_token = {}
    for key, scale, shift in (("old", 0.5, -1.5), ("ref", 0.5, -1.5), ("rollout", 0.5, -1.5), ("lp", 0.5, -1.5),
                              ("ent", 1.0, 1.0), ("values", 1.0, 0.0), ("new_values", 1.0, 0.0)):
        per_token[key] = [(torch.rand(len(m), generator=g) * scale + shift).tolist() for m in MASKS]
    ids = [torch.randint(10, 200, (len(m),), generator=g).tolist() for m in MASKS]
    return per_token, ids


def _garbage(per_token, seed: int = 1):
    """The same numbers on policy tokens, others elsewhere (log-probs stay <= 0, finite)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, rows in per_token.items():
        out[key] = [[x if keep else float(torch.rand(1, generator=g)) * -3.0 for x, keep in zip(row, m)]
                    for row, m in zip(rows, MASKS)]
    return out


def _compact(rows, masks):
    return [[x for x, keep in zip(row, m) if keep] for row, m in zip(rows, masks)]


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_inserted_tokens_have_no_weight_and_no_gradient(estimator, agg):
    per_token, ids = _data()
    out, grads, mask = _run(estimator, agg, per_token, MASKS, ids)
    inserted = torch.tensor([[1 - x for x in m] + [0] * (mask.shape[1] - len(m)) for m in MASKS]).bool()
    assert inserted.sum() == 7 and mask[inserted].eq(0).all()
    for name, grad in grads.items():  # exactly zero gradient at every inserted position
        assert grad[inserted].eq(0).all(), name
        assert grad[~inserted & mask.bool()].ne(0).any(), name  # and the policy tokens do get one
    for name in ("advantages", "returns", "is_weights"):
        assert out[name][inserted].eq(0).all(), name

    # garbage where the policy did not sample: not one output bit moves
    dirty_out, dirty_grads, _ = _run(estimator, agg, _garbage(per_token), MASKS, ids)
    for name, value in out.items():
        assert torch.equal(value, dirty_out[name]), name
    for name, grad in grads.items():
        assert torch.equal(grad, dirty_grads[name]), name

    # the inserted tokens deleted: the same numbers at the policy tokens (no count, no GAE step)
    policy = [[1] * sum(m) for m in MASKS]
    small_out, small_grads, small_mask = _run(estimator, agg, {k: _compact(v, MASKS) for k, v in per_token.items()},
                                              policy, _compact(ids, MASKS))
    where = mask.bool()
    for name, value in out.items():
        big = value[where] if value.dim() == 2 else value
        small = small_out[name][small_mask.bool()] if value.dim() == 2 else small_out[name]
        torch.testing.assert_close(big, small, rtol=1e-5, atol=1e-6, msg=name)
    for name, grad in grads.items():
        torch.testing.assert_close(grad[where], small_grads[name][small_mask.bool()], rtol=1e-5, atol=1e-7,
                                   msg=name)


def test_episode_validates_its_lengths():
    with pytest.raises(ValueError, match="policy mask"):
        Episode(0, [1], [2, 3], [1], None, [Turn("assistant", 0, 2)], "stop")
    with pytest.raises(ValueError, match="stop_reason"):
        Episode(0, [1], [2], [1], None, [Turn("assistant", 0, 1)], "eos")
    e = Episode.single_turn(3, [1, 2], [4, 5, 6], [-0.1, -0.2, -0.3], finished=False)
    assert (e.policy_mask, e.turns, e.stop_reason, e.finished) == ([1, 1, 1], [Turn("assistant", 0, 3)], "length", False)


def test_inserted_tail_ids_change_no_loss_and_no_gradient(tiny_model_dir):
    """Real model, trainer's loss functions: an inserted span after the last policy token is
    context for nothing trained, so its ids (and the model's outputs there) must not matter."""
    cfg = _config("gae", "token-mean")
    torch.manual_seed(0)
    models = PolicyModels(cfg.model, str(tiny_model_dir), torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    heads = [torch.randint(10, 200, (n,), generator=g).tolist() for n in (4, 6)]
    masks = [[1] * 4 + [0] * 5, [1, 1, 0, 0, 1, 1] + [0] * 3]

    def grads_with(tail_seed: int):
        gt = torch.Generator().manual_seed(tail_seed)
        ids = [h + torch.randint(10, 200, (len(m) - len(h),), generator=gt).tolist() for h, m in zip(heads, masks)]
        episodes = [_episode(i, ids[i], masks[i], None) for i in range(2)]
        traj = trajectory_of(episodes, pad_id=0, device=torch.device("cpu"))
        B, R = traj.mask.shape
        gg = torch.Generator().manual_seed(7)
        traj.old_lp, traj.ref_lp = -torch.rand(B, R, generator=gg), -torch.rand(B, R, generator=gg)
        traj.values, traj.returns = torch.randn(B, R, generator=gg), torch.randn(B, R, generator=gg)
        traj.advantages = torch.randn(B, R, generator=gg)
        out = {}
        for role, fn, params in ((Role.ACTOR, actor_loss_fn(cfg), models.actor_parameters()),
                                 (Role.CRITIC, critic_loss_fn(cfg), models.critic_parameters())):
            with models.role(role):
                for p in params:
                    p.grad = None
                loss, _ = fn(models, traj)
                loss.backward()
                out[role] = loss.detach()
                out.update({f"{role}:{i}": p.grad.clone() for i, p in enumerate(params)})
        return out

    a, b = grads_with(1), grads_with(2)
    assert a.keys() == b.keys() and len(a) > 4
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert any(a[k].abs().sum() > 0 for k in a if ":" in k)
