"""The KL in the reward reaches every estimator's advantages, as verl's apply_kl_penalty does."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tinyrl.config import load_config
from tinyrl.models import make_batch
from tinyrl.rl.kl import FixedKLController
from tinyrl.trainer import Trainer
from tinyrl.trajectory import Trajectory


def _traj() -> Trajectory:
    """Two prompts x two samples of 2 tokens; both samples of a prompt score the same, so
    without the KL a grouped estimator sees no difference. Row 1 and row 3 drifted from the reference."""
    batch = make_batch([[1, 2]] * 4, [[5, 6]] * 4, pad_id=0)
    old = torch.zeros(4, 2)
    ref = torch.tensor([[0.0, 0.0], [-0.5, -0.5], [0.0, 0.0], [-0.25, -0.25]])  # k1 = old - ref
    return Trajectory(batch=batch, group_ids=torch.tensor([0, 0, 1, 1]), old_lp=old, ref_lp=ref,
                      scores=torch.tensor([1.0, 1.0, 0.0, 0.0]))


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_grouped_estimators_see_the_kl_penalty_in_the_reward(estimator):
    """grpo, dr_grpo and rloo read the sequence scores, which the in-reward KL never touched:
    kl_in_reward=true built the reference, logged kl/mean and changed nothing."""
    cfg = load_config("countdown-demo", [f"algorithm.adv_estimator={estimator}", "algorithm.kl_in_reward=true",
                                         "algorithm.use_kl_loss=false"], check=False)
    host = SimpleNamespace(cfg=cfg, kl_ctrl=FixedKLController(1.0), rollout_is="off")
    traj = _traj()
    metrics = Trainer._advantages(host, traj)
    # sequence reward = score - 1.0 * sum of k1 over the 2 tokens: [1, 0, 0, -0.5]
    assert metrics["kl/mean"] == pytest.approx((0.5 + 0.25) / 4)
    a = traj.advantages[:, 0]
    assert a[0] > a[1] and a[2] > a[3], a  # the sample that drifted is worse than its twin
    if estimator == "dr_grpo":
        assert a.tolist() == pytest.approx([0.5, -0.5, 0.25, -0.25])


@pytest.mark.parametrize("kind", ["k1", "low_var_kl"])
def test_a_kl_loss_run_logs_the_estimator_its_loss_uses(kind):
    """kl/mean was the k1 estimate whatever algorithm.kl_loss_type said (k3 by default)."""
    from tinyrl.rl.kl import kl_penalty
    from tinyrl.rl.masking import masked_mean

    cfg = load_config("countdown-demo", ["algorithm.adv_estimator=grpo", "algorithm.kl_in_reward=false",
                                         "algorithm.use_kl_loss=true", f"algorithm.kl_loss_type={kind}"], check=False)
    host = SimpleNamespace(cfg=cfg, kl_ctrl=FixedKLController(1.0), rollout_is="off")
    traj = _traj()
    metrics = Trainer._advantages(host, traj)
    expected = float(masked_mean(kl_penalty(traj.old_lp, traj.ref_lp, kind), traj.mask))
    assert metrics["kl/mean"] == pytest.approx(expected)
    if kind != "k1":  # k3 of these rows is not k1's (0.5 + 0.25) / 4
        assert metrics["kl/mean"] != pytest.approx((0.5 + 0.25) / 4)
