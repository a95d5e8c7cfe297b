"""Advantage estimators, checked against hand-worked numbers."""

import pytest
import torch

from tinyrl.errors import TinyRLError
from tinyrl.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    gae_advantages,
    grpo_advantages,
    place_sequence_reward,
    reinforce_pp_advantages,
    rloo_advantages,
)
from tinyrl.roles import ESTIMATORS, needs_critic


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# ---- reward placement ---------------------------------------------------------------------------

def test_place_sequence_reward_on_last_valid_token():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    out = place_sequence_reward(torch.tensor([1.0, 0.5, 7.0]), mask)
    # row 2 has no valid token: nowhere to put the 7
    close(out, [[0.0, 1.0, 0.0], [0.0, 0.0, 0.5], [0.0, 0.0, 0.0]])


def test_place_sequence_reward_accepts_int_scores_and_bool_mask():
    out = place_sequence_reward(torch.tensor([1, 0]), torch.tensor([[True, False], [True, True]]))
    assert out.dtype == torch.float32
    close(out, [[1.0, 0.0], [0.0, 0.0]])


# ---- GAE ----------------------------------------------------------------------------------------

def test_gae_gamma_lam_one_three_tokens():
    # r = [0, 0, 1], V = [0.5, 0.6, 0.7], V after the end = 0
    # t=2: delta = 1 + 0 - 0.7 = 0.3             A2 = 0.3
    # t=1: delta = 0 + 0.7 - 0.6 = 0.1           A1 = 0.1 + 0.3 = 0.4
    # t=0: delta = 0 + 0.6 - 0.5 = 0.1           A0 = 0.1 + 0.4 = 0.5
    # returns = A + V = [1, 1, 1]; whiten A: mean 0.4, unbiased var (0.01 + 0 + 0.01)/2 = 0.01 -> [1, 0, -1]
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = gae_advantages(r, v, torch.ones(1, 3), gamma=1.0, lam=1.0)
    close(ret, [[1.0, 1.0, 1.0]])
    close(adv, [[1.0, 0.0, -1.0]], atol=1e-4)


def test_gae_discounted_with_padding_ignores_padded_values_and_rewards():
    # valid tokens 0..1; padding holds garbage r=9, V=5 that must not leak in. gamma = lam = 0.5
    # t=1: delta = 1 + 0.5*0 - 2 = -1            A1 = -1
    # t=0: delta = 0 + 0.5*2 - 1 = 0             A0 = 0 + 0.25*(-1) = -0.25
    # returns = A + V = [0.75, 1.0, 0]
    # whiten [-0.25, -1]: mean -0.625, unbiased var 2*0.375^2/1 = 0.28125, std 0.530330 -> [+0.707107, -0.707107]
    r = torch.tensor([[0.0, 1.0, 9.0]])
    v = torch.tensor([[1.0, 2.0, 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    adv, ret = gae_advantages(r, v, mask, gamma=0.5, lam=0.5)
    close(ret, [[0.75, 1.0, 0.0]])
    close(adv, [[0.707107, -0.707107, 0.0]], atol=1e-4)


def test_gae_carries_no_autograd_history():
    v = torch.tensor([[0.5, 0.6]], requires_grad=True)
    adv, ret = gae_advantages(torch.tensor([[0.0, 1.0]]), v, torch.ones(1, 2))
    assert not adv.requires_grad and not ret.requires_grad


# ---- GRPO / Dr.GRPO -------------------------------------------------------------------------------

def test_grpo_one_group_1001():
    # mean 0.5; deviations +-0.5; unbiased var = 4*0.25/3 = 1/3; std 0.577350; A = +-0.5/0.577351 = +-0.866024
    mask = torch.tensor([[1, 1, 0]] * 4)
    adv, ret = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([7, 7, 7, 7]), mask)
    a = 0.866024
    close(adv, [[a, a, 0.0], [-a, -a, 0.0], [-a, -a, 0.0], [a, a, 0.0]])
    close(ret, adv)


def test_grpo_two_groups_with_string_ids_and_a_singleton():
    # groups a: [1, 0] -> mean 0.5, std sqrt(0.5) = 0.707107 -> +-0.707106
    #        b: [0, 1] -> same, mirrored;  c: [0.7] alone -> mean 0, std 1 -> 0.7 / (1 + 1e-6)
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.7])
    adv, _ = grpo_advantages(scores, ["a", "b", "a", "b", "c"], torch.ones(5, 1))
    close(adv[:, 0], [0.707106, -0.707106, -0.707106, 0.707106, 0.7])


def test_grpo_equal_scores_give_zero_advantage():
    adv, _ = grpo_advantages(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0, 0, 0]), torch.ones(3, 2))
    close(adv, torch.zeros(3, 2))


def test_dr_grpo_does_not_divide_by_std():
    # 1001: s - mean = [0.5, -0.5, -0.5, 0.5]
    adv, _ = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4), torch.ones(4, 1), norm_by_std=False)
    close(adv[:, 0], [0.5, -0.5, -0.5, 0.5])


# ---- RLOO -----------------------------------------------------------------------------------------

def test_rloo_leave_one_out_baseline():
    # group 0 = [1, 0, 0, 1]: A0 = 1 - (0+0+1)/3 = 2/3, A1 = 0 - (1+0+1)/3 = -2/3
    # group 1 = [3, 5]: A = 3 - 5 = -2, 5 - 3 = 2;   group 2 = [4] alone -> 0
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 5.0, 4.0])
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    mask = torch.ones(7, 2)
    mask[4, 1] = 0
    adv, ret = rloo_advantages(scores, ids, mask)
    close(adv[:, 0], [2 / 3, -2 / 3, -2 / 3, 2 / 3, -2.0, 2.0, 0.0])
    assert adv[4, 1].item() == 0.0  # masked token
    close(ret, adv)


# ---- REINFORCE++ ----------------------------------------------------------------------------------

def test_reinforce_pp_discounted_returns_whitened():
    # gamma 0.5; row 0 r = [0, 0, 1] -> G = [0.25, 0.5, 1]; row 1 r = [0, 2, pad 9] -> G = [1, 2, 0]
    # valid G = .25 .5 1 1 2: mean 0.95; squared deviations .49 .2025 .0025 .0025 1.1025 = 1.8
    # unbiased var 1.8/4 = 0.45, std 0.670820 -> A = -1.043498 -0.670820 0.074536 0.074536 1.565248
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = reinforce_pp_advantages(r, mask, gamma=0.5)
    close(ret, [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]])
    close(adv, [[-1.043498, -0.670820, 0.074536], [0.074536, 1.565248, 0.0]], atol=1e-4)


# ---- dispatch ---------------------------------------------------------------------------------------

def test_dispatch_table_names():
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "grpo", "dr_grpo", "rloo", "reinforce_pp"}


def test_unknown_estimator_raises_with_the_valid_names():
    with pytest.raises(TinyRLError) as e:
        compute_advantages("ppo", mask=torch.ones(1, 1), scores=torch.ones(1))
    assert "grpo" in e.value.hint and "reinforce_pp" in e.value.hint
    with pytest.raises(TinyRLError):
        needs_critic("ppo")


def test_needs_critic_only_for_gae():
    assert needs_critic("gae")
    assert not any(needs_critic(n) for n in ("grpo", "dr_grpo", "rloo", "reinforce_pp"))


def test_the_dispatch_table_is_the_roles_table():
    # tinyrl.roles is the one list of estimator names; the math dispatches exactly those
    assert list(ADVANTAGE_ESTIMATORS) == list(ESTIMATORS)


def test_gae_without_values_is_a_user_error():
    with pytest.raises(TinyRLError, match="critic values"):
        compute_advantages("gae", mask=torch.ones(1, 2), scores=torch.ones(1))


def test_grpo_without_group_ids_is_a_user_error():
    with pytest.raises(TinyRLError, match="group ids"):
        compute_advantages("grpo", mask=torch.ones(2, 2), scores=torch.ones(2))


def test_dispatch_grpo_from_token_rewards_sums_them():
    # token rewards sum per row to [1, 0] -> one group -> mean .5, std .707107 -> +-0.707106
    mask = torch.tensor([[1, 1], [1, 0]])
    r = torch.tensor([[0.0, 1.0], [0.0, 5.0]])  # the 5 sits on padding and must not count
    adv, _ = compute_advantages("grpo", mask=mask, token_rewards=r, group_ids=torch.tensor([0, 0]))
    close(adv, [[0.707106, 0.707106], [-0.707106, 0.0]])


def test_dispatch_gae_places_scores_when_no_token_rewards():
    # same numbers as the hand-worked 3-token GAE test, reached from a sequence score of 1
    adv, ret = compute_advantages(
        "gae", mask=torch.ones(1, 3), scores=torch.tensor([1.0]), values=torch.tensor([[0.5, 0.6, 0.7]])
    )
    close(ret, [[1.0, 1.0, 1.0]])
    close(adv, [[1.0, 0.0, -1.0]], atol=1e-4)


def test_dispatch_dr_grpo_and_reinforce_pp():
    adv, _ = compute_advantages("dr_grpo", mask=torch.ones(2, 1), scores=torch.tensor([3.0, 1.0]), group_ids=[0, 0])
    close(adv[:, 0], [1.0, -1.0])                               # mean 2
    _, ret = compute_advantages("reinforce_pp", mask=torch.ones(1, 2), scores=torch.tensor([2.0]), gamma=0.5)
    close(ret, [[1.0, 2.0]])                                    # score on the last token, 0.5 * 2 before it


# An episode with a tool turn: policy tokens at 0, 1 and 4; positions 2-3 are inserted context
# (policy_mask 0), with values and a reward there that must be ignored.
SPAN_MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])


def test_gae_skips_an_inserted_span_hand_worked():
    """gamma = 0.9, lam = 0.8. Policy steps 0, 1, 4 are consecutive decisions:
    t=4: delta = 1.0 + 0 - 0.4 = 0.6;                A4 = 0.6
    t=1: delta = 0 + 0.9*V4 - V1 = 0.36 - 0.2 = 0.16; A1 = 0.16 + 0.72*0.6 = 0.592
    t=0: delta = 0 + 0.9*V1 - V0 = 0.18 - 0.5 = -0.32; A0 = -0.32 + 0.72*0.592 = 0.10624
    (V at the inserted tokens, 9.0, and the reward 7.0 there never enter.)"""
    values = torch.tensor([[0.5, 0.2, 9.0, 9.0, 0.4]])
    rewards = torch.tensor([[0.0, 0.0, 7.0, 0.0, 1.0]])
    adv, ret = gae_advantages(rewards, values, SPAN_MASK, gamma=0.9, lam=0.8)
    close(ret, [[0.10624 + 0.5, 0.592 + 0.2, 0.0, 0.0, 0.6 + 0.4]], atol=1e-6)
    raw = torch.tensor([0.10624, 0.592, 0.6], dtype=torch.float64)
    white = (raw - raw.mean()) / (raw.var(unbiased=True) + 1e-8).sqrt()
    close(adv, [[white[0], white[1], 0.0, 0.0, white[2]]], atol=1e-5)


def test_reinforce_pp_carries_the_return_through_an_inserted_span():
    """G4 = 1.0, G1 = 0.9 * G4, G0 = 0.9 * G1: discounted per policy token, not per inserted one."""
    rewards = torch.tensor([[0.0, 0.0, 7.0, 0.0, 1.0]])
    _, ret = reinforce_pp_advantages(rewards, SPAN_MASK, gamma=0.9)
    close(ret, [[0.81, 0.9, 0.0, 0.0, 1.0]], atol=1e-6)
