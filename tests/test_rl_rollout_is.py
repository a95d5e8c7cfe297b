"""Rollout importance-sampling weights and the parity measure, against hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from tinyrl.rl.losses import policy_loss
from tinyrl.rl.rollout_is import probs_diff, rollout_is_weights

# Two sequences; the second has one padding token. log-ratios lp_old - lp_roll:
#   row 0: ln 1.5, ln 4, ln 0.5      row 1: ln 1, ln 3, (pad)
OLD = torch.log(torch.tensor([[0.3, 0.4, 0.1], [0.2, 0.6, 0.5]]))
ROLL = torch.log(torch.tensor([[0.2, 0.1, 0.2], [0.2, 0.2, 0.9]]))
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_token_level_weights_are_truncated_ratios():
    w, st = rollout_is_weights(OLD, ROLL, MASK, "token", cap=2.0)
    expected = torch.tensor([[1.5, 2.0, 0.5], [1.0, 2.0, 0.0]])  # 4 and 3 capped at 2; pad 0
    torch.testing.assert_close(w, expected)
    assert float(st["rollout_is/mean"]) == pytest.approx((1.5 + 2 + 0.5 + 1 + 2) / 5)
    assert float(st["rollout_is/clip_frac"]) == pytest.approx(2 / 5)


def test_sequence_level_weights_multiply_the_ratios():
    w, st = rollout_is_weights(OLD, ROLL, MASK, "sequence", cap=5.0)
    # row 0: 1.5 * 4 * 0.5 = 3 (under the cap); row 1: 1 * 3 = 3, the padded token ignored
    expected = torch.tensor([[3.0, 3.0, 3.0], [3.0, 3.0, 0.0]])
    torch.testing.assert_close(w, expected, rtol=1e-5, atol=1e-6)
    assert float(st["rollout_is/clip_frac"]) == 0.0
    w2, st2 = rollout_is_weights(OLD, ROLL, MASK, "sequence", cap=2.0)
    torch.testing.assert_close(w2, 2.0 * MASK)
    assert float(st2["rollout_is/clip_frac"]) == 1.0


def test_extreme_gaps_stay_finite_and_capped():
    old = torch.tensor([[0.0, -200.0]])
    roll = torch.tensor([[-300.0, 0.0]])
    w, _ = rollout_is_weights(old, roll, torch.ones(1, 2), "token", cap=2.0)
    assert torch.isfinite(w).all() and w[0, 0] == 2.0 and w[0, 1] < 1e-8
    ws, _ = rollout_is_weights(old, roll, torch.ones(1, 2), "sequence", cap=2.0)
    assert torch.isfinite(ws).all()


def test_weights_scale_each_token_of_the_policy_loss():
    # ratio 1 everywhere (lp == old), A = 1: per-token loss -1, so the loss is -mean(w).
    lp = torch.zeros(2, 3, requires_grad=True)
    w, _ = rollout_is_weights(OLD, ROLL, MASK, "token", cap=2.0)
    loss, _ = policy_loss(lp, torch.zeros(2, 3), torch.ones(2, 3), MASK, is_weights=w)
    assert float(loss) == pytest.approx(-(1.5 + 2 + 0.5 + 1 + 2) / 5)
    loss.backward()  # gradient d/dlp of -w*ratio = -w / n_valid, the weights are constants
    torch.testing.assert_close(lp.grad, -w / 5)


def test_probs_diff_is_mean_absolute_probability_gap_over_valid_tokens():
    d = probs_diff(OLD, ROLL, MASK)
    assert float(d) == pytest.approx((0.1 + 0.3 + 0.1 + 0.0 + 0.4) / 5)
    assert float(probs_diff(OLD, OLD, MASK)) == 0.0
    assert math.isfinite(float(probs_diff(torch.full((1, 2), -1e4), torch.zeros(1, 2), torch.ones(1, 2))))
