"""Loss aggregation, PPO policy/value losses, entropy, KL loss, actor total, explained variance,
gradient clipping; all against hand-worked numbers."""

import math

import pytest
import torch

from tinyrl.errors import TinyRLError
from tinyrl.rl.grad import clip_grad_norm_or_skip
from tinyrl.rl.losses import (
    actor_loss,
    agg_loss,
    entropy_from_logits,
    explained_variance,
    kl_loss,
    policy_loss,
    value_loss,
)

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
RAGGED = torch.tensor([[1, 1, 0], [1, 0, 0]])   # row 0 keeps 1, 2; row 1 keeps 4


# ---- aggregation ----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),                  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),            # mean(1 + 2, 4) = (3 + 4) / 2
        ("seq-mean-token-mean", 2.75),          # mean(3/2, 4/1) = (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 3),     # (3 + 4) / T, T = 3 (verl: summed over rows, not averaged)
    ],
)
def test_agg_modes_on_ragged_mask(mode, expected):
    assert agg_loss(LOSS, RAGGED, mode).item() == pytest.approx(expected)


def test_dr_grpo_norm_uses_the_given_max_len():
    assert agg_loss(LOSS, RAGGED, "seq-mean-token-sum-norm", max_len=7).item() == pytest.approx(1.0)  # 7 / 7


def test_seq_mean_token_mean_with_an_empty_row_is_finite():
    # row 1 has no tokens: contributes 0, still counts as a row -> (1.5 + 0) / 2
    assert agg_loss(LOSS, torch.tensor([[1, 1, 0], [0, 0, 0]]), "seq-mean-token-mean").item() == 0.75


def test_unknown_agg_mode():
    with pytest.raises(TinyRLError) as e:
        agg_loss(LOSS, RAGGED, "token-sum")
    assert "seq-mean-token-sum-norm" in e.value.hint


# ---- policy loss ------------------------------------------------------------------------------------

def _five_cases():
    # token: (A, lp - old_lp); ratio = exp(d)
    # 1: A=+1, r=e^.5=1.648721 -> max(-1.648721, -1.2) = -1.2             clipped (upper)
    # 2: A=+1, r=e^-.5=.606531 -> max(-0.606531, -0.8) = -0.606531        unclipped (pessimistic)
    # 3: A=-1, r=e^2=7.389056  -> max(7.389056, 1.2) = 7.389 -> dual min(7.389, 3) = 3
    # 4: A=-1, r=e^.1=1.105171 -> 1.105171 (inside the clip range)
    # 5: A=-1, r=e^-.5         -> max(0.606531, 0.8) = 0.8                clipped (lower)
    # 6: padding with garbage A=100, d=10
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 100.0]])
    d = torch.tensor([[0.5, -0.5, 2.0, 0.1, -0.5, 10.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    old = torch.full_like(d, -3.0)
    lp = (old + d).requires_grad_(True)
    return lp, old, adv, mask


def test_policy_loss_hand_worked_cases_and_stats():
    lp, old, adv, mask = _five_cases()
    loss, stats = policy_loss(lp, old, adv, mask)
    # (-1.2 - 0.606531 + 3 + 1.105171 + 0.8) / 5 = 3.098640 / 5 = 0.619728
    assert loss.item() == pytest.approx(0.619728, abs=1e-5)
    assert stats["pg_clipfrac"].item() == pytest.approx(2 / 5)        # tokens 1 and 5
    assert stats["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)  # token 3
    assert stats["ppo_kl"].item() == pytest.approx(-0.32)             # -(.5 - .5 + 2 + .1 - .5) / 5


def test_policy_loss_gradient_flows_only_through_unclipped_tokens():
    lp, old, adv, mask = _five_cases()
    loss, _ = policy_loss(lp, old, adv, mask)
    loss.backward()
    # d/dlp (-A * ratio) = -A * ratio, / 5 tokens: token 2: -0.606531/5 = -0.121306; token 4: 1.105171/5 = 0.221034
    expected = torch.tensor([[0.0, -0.121306, 0.0, 0.221034, 0.0, 0.0]])
    torch.testing.assert_close(lp.grad, expected, atol=1e-5, rtol=0)


def test_dual_clip_does_not_touch_positive_advantages():
    # A=+1, r=e^2: max(-7.389, -1.2) = -1.2; a dual clip applied by mistake would give min(-1.2, -3) = -3
    loss, stats = policy_loss(torch.tensor([[2.0]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-1.2)
    assert stats["pg_clipfrac_lower"].item() == 0.0


def test_clip_higher_uses_eps_high_for_the_upper_bound():
    # DAPO 0.2 / 0.28: A=+1, r=e^.5 -> clamp to 1.28 -> -1.28
    loss, _ = policy_loss(torch.tensor([[0.5]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.ones(1, 1),
                          eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(-1.28)


def test_extreme_log_ratio_is_clamped_to_finite():
    # d = 100 -> clamped to 20; A = -1: max(e^20, 1.2) then dual clip -> 3
    loss, _ = policy_loss(torch.tensor([[100.0]]), torch.tensor([[0.0]]), torch.tensor([[-1.0]]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(3.0)


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_dual_clip_constant_must_exceed_one(c):
    with pytest.raises(TinyRLError, match="clip_ratio_c"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_ratio_c=c)


# ---- value loss ---------------------------------------------------------------------------------------

def test_value_loss_clipped():
    # token 0: v=1, old=0 -> vclip = clamp(1, -.5, .5) = .5; R=1: (1-1)^2 = 0, (.5-1)^2 = .25 -> .25 (clipped)
    # token 1: v=2, old=1.9 -> vclip = 2; R=0: 4 and 4 -> 4
    # token 2: padding garbage
    # loss = 0.5 * mean(.25, 4) = 1.0625; vf_clipfrac = 1/2
    values = torch.tensor([[1.0, 2.0, 50.0]])
    old = torch.tensor([[0.0, 1.9, 0.0]])
    returns = torch.tensor([[1.0, 0.0, -50.0]])
    loss, stats = value_loss(values, old, returns, torch.tensor([[1, 1, 0]]), cliprange_value=0.5)
    assert loss.item() == pytest.approx(1.0625)
    assert stats["vf_clipfrac"].item() == pytest.approx(0.5)


# ---- entropy, KL loss, total ------------------------------------------------------------------------

def test_entropy_from_logits():
    # uniform over 4: ln 4 = 1.386294
    # logits [0, ln 3, -1e9, -1e9] -> p = [.25, .75, 0, 0]: .25 ln 4 + .75 ln(4/3) = .346574 + .215762 = .562335
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e9, -1e9]])
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([1.386294, 0.562335]), atol=1e-5, rtol=0)
    assert entropy_from_logits(torch.zeros(2, 3, 5)).shape == (2, 3)  # [..., V] -> [...]


def test_kl_loss_k3_token_mean():
    # k3 at ref - lp = -1 and +1: 0.367879 and 0.718282; third token is padding -> mean 0.543081
    lp = torch.tensor([[-1.0, -2.0, -1.0]])
    ref = torch.tensor([[-2.0, -1.0, -6.0]])
    assert kl_loss(lp, ref, torch.tensor([[1, 1, 0]]), "k3").item() == pytest.approx(0.543081, abs=1e-5)
    assert kl_loss(lp, ref, torch.tensor([[1, 1, 0]]), "k3", "seq-mean-token-sum").item() == pytest.approx(1.086161, abs=1e-5)


def test_actor_loss_adds_the_kl_term():
    # 1 - 0.1*2 + 0.5*3 = 2.3  (TinyZero's sign bug would give 1 - 0.2 - 1.5 = -0.7)
    total = actor_loss(torch.tensor(1.0), entropy=torch.tensor(2.0), entropy_coef=0.1, kl=torch.tensor(3.0), kl_coef=0.5)
    assert total.item() == pytest.approx(2.3)
    assert actor_loss(torch.tensor(1.0)).item() == 1.0


def test_explained_variance():
    # R = [1, 2, 3], V = [1, 2, 4]: R - V = [0, 0, -1], unbiased var 1/3; var(R) = 1 -> 1 - (1/3)/(1 + 1e-5) = 0.666669
    mask = torch.tensor([[1, 1, 1, 0]])
    ev = explained_variance(torch.tensor([[1.0, 2.0, 4.0, 99.0]]), torch.tensor([[1.0, 2.0, 3.0, -99.0]]), mask)
    assert ev.item() == pytest.approx(0.666669, abs=1e-5)


# ---- gradient clipping --------------------------------------------------------------------------------

def _param(grad):
    p = torch.nn.Parameter(torch.zeros(len(grad)))
    p.grad = torch.tensor(grad)
    return p


def test_clip_grad_norm_clips_and_reports_the_preclip_norm():
    p, q = _param([3.0]), _param([4.0])                        # global norm sqrt(9 + 16) = 5
    norm, finite = clip_grad_norm_or_skip(iter([p, q]), max_norm=1.0)
    assert (norm, finite) == (pytest.approx(5.0), True)
    torch.testing.assert_close(torch.cat([p.grad, q.grad]), torch.tensor([0.6, 0.8]), atol=1e-5, rtol=0)


def test_clip_grad_norm_below_max_leaves_grads():
    p = _param([3.0, 4.0])
    assert clip_grad_norm_or_skip([p], max_norm=10.0) == (pytest.approx(5.0), True)
    torch.testing.assert_close(p.grad, torch.tensor([3.0, 4.0]))


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_clip_grad_norm_non_finite_says_skip(bad):
    p = _param([bad, 4.0])
    norm, finite = clip_grad_norm_or_skip([p], max_norm=1.0)
    assert not finite and not math.isfinite(norm)
    assert p.grad[1].item() == 4.0                             # untouched, not scaled by NaN


def test_clip_grad_norm_without_grads():
    assert clip_grad_norm_or_skip([torch.nn.Parameter(torch.zeros(2))], 1.0) == (0.0, True)


def test_actor_objective_hand_worked():
    from tinyrl.rl.losses import actor_objective

    # One sequence of two tokens, ratio 1 (lp == old), A = [1, -2]: pg per token [-1, 2] -> mean 0.5.
    lp = torch.log(torch.tensor([[0.5, 0.25]]))
    ent = torch.tensor([[1.0, 3.0]])                     # mean 2
    ref = torch.log(torch.tensor([[0.25, 0.25]]))         # k1 = lp - ref = [ln 2, 0]
    loss, st = actor_objective(lp, ent, lp, torch.tensor([[1.0, -2.0]]), torch.ones(1, 2), ref_logprob=ref,
                               entropy_coef=0.1, kl_coef=0.5, kl_type="k1")
    assert float(st["pg_loss"]) == pytest.approx(0.5)
    assert float(st["kl_loss"]) == pytest.approx(math.log(2) / 2)
    # 0.5 - 0.1 * 2 + 0.5 * ln2 / 2: the KL is ADDED (pulls toward the reference), entropy subtracted
    assert float(loss) == pytest.approx(0.5 - 0.2 + 0.25 * math.log(2))
    no_kl, st2 = actor_objective(lp, ent, lp, torch.tensor([[1.0, -2.0]]), torch.ones(1, 2), entropy_coef=0.0)
    assert float(no_kl) == pytest.approx(0.5) and "kl_loss" not in st2
