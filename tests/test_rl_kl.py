"""KL estimators, KL in the reward, and the coefficient controllers, with hand-worked numbers."""

import pytest
import torch

from tinyrl.errors import TinyRLError
from tinyrl.rl.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    kl_penalty,
    make_kl_controller,
)

LP = torch.tensor([-1.0, -2.0, -1.0])
REF = torch.tensor([-2.0, -1.0, -6.0])   # lp - ref = [1, -1, 5]


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_k1_abs_k2():
    close(kl_penalty(LP, REF, "k1"), [1.0, -1.0, 5.0])
    close(kl_penalty(LP, REF, "abs"), [1.0, 1.0, 5.0])
    close(kl_penalty(LP, REF, "k2"), [0.5, 0.5, 12.5])       # 0.5 * d^2


def test_k3_known_values():
    # k = ref - lp = [-1, 1, -5]
    # exp(-1) + 1 - 1 = 0.367879;  exp(1) - 1 - 1 = 0.718282;  exp(-5) + 5 - 1 = 4.006738
    close(kl_penalty(LP, REF, "k3"), [0.367879, 0.718282, 4.006738])


def test_k3_clamps_both_ways():
    # lp - ref = +50: k clamped to -20 -> exp(-20) + 20 - 1 = 19.0 -> clamped to 10
    # lp - ref = -50: k clamped to +20 -> exp(20) - 21 = 4.85e8 -> clamped to 10
    out = kl_penalty(torch.tensor([0.0, -50.0]), torch.tensor([-50.0, 0.0]), "k3")
    close(out, [10.0, 10.0])


def test_aliases_match():
    for a, b in (("mse", "k2"), ("low_var_kl", "k3"), ("kl", "k1")):
        torch.testing.assert_close(kl_penalty(LP, REF, a), kl_penalty(LP, REF, b))


def test_the_config_takes_every_name_the_estimators_take():
    """kl_penalty() took verl's "kl" while the config refused it: one table now (tinyrl.rl.kl_names)."""
    from tinyrl.config import load_config
    from tinyrl.rl.kl_names import KL_NAMES

    for name in KL_NAMES:
        cfg = load_config("countdown-tiny", [f"algorithm.kl_penalty={name}", f"algorithm.kl_loss_type={name}"])
        assert kl_penalty(LP, REF, cfg.algorithm.kl_penalty).shape == LP.shape


def grad_of(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, d sum(value) / d logprob) of one estimator at LP, REF."""
    lp = LP.clone().requires_grad_(True)
    value = kl_penalty(lp, REF, kind)
    value.sum().backward()
    return value.detach(), lp.grad


def test_a_plus_name_has_its_estimators_value_and_k2s_gradient():
    """verl's "k3+" (straight-through): k3 forward, d/dlp of 0.5 (lp - ref)^2 = lp - ref backward."""
    value, grad = grad_of("k3")
    close(value, [0.367879, 0.718282, 4.006738])
    close(grad, [0.632121, -1.718282, 0.993262])       # k3's own: 1 - exp(ref - lp)
    for name in ("k3+", "low_var_kl+"):
        value, grad = grad_of(name)
        close(value, [0.367879, 0.718282, 4.006738])    # k3's value
        close(grad, [1.0, -1.0, 5.0])                   # lp - ref
    for name, forward in (("k1+", [1.0, -1.0, 5.0]), ("abs+", [1.0, 1.0, 5.0]), ("mse+", [0.5, 0.5, 12.5])):
        value, grad = grad_of(name)
        close(value, forward)
        close(grad, [1.0, -1.0, 5.0])


def test_the_kl_loss_trains_on_the_straight_through_gradient():
    """The loss the learner builds (losses.kl_loss, kl_type = algorithm.kl_loss_type) takes the "+"."""
    from tinyrl.rl.losses import kl_loss

    lp = LP.clone().requires_grad_(True)
    kl_loss(lp.unsqueeze(0), REF.unsqueeze(0), torch.ones(1, 3), kind="k3+").backward()
    close(lp.grad, [1 / 3, -1 / 3, 5 / 3])               # token-mean of lp - ref


def test_verls_full_is_refused_with_why_and_what_instead():
    from tinyrl.config import load_config

    for name in ("full", "full+"):
        with pytest.raises(TinyRLError) as e:
            kl_penalty(LP, REF, name)
        assert "whole vocabulary" in e.value.message and "k3" in e.value.hint
        with pytest.raises(TinyRLError) as e:
            load_config("countdown-tiny", [f"algorithm.kl_penalty={name}", f"algorithm.kl_loss_type={name}",
                                           "rollout.n=0"])
        text = str(e.value)
        for key in ("algorithm.kl_penalty", "algorithm.kl_loss_type"):
            assert f"{key} = '{name}' is the KL over the whole vocabulary" in text and "use k3" in text
        assert "rollout.n" in text                       # said together with the other problems


def test_unknown_kind_lists_valid_names():
    with pytest.raises(TinyRLError) as e:
        kl_penalty(LP, REF, "k4")
    assert "low_var_kl" in e.value.hint


def test_apply_kl_in_reward_subtracts_beta_kl_on_valid_tokens():
    # d = lp - ref = [[.1 .2 .3], [.4 .5 (pad 9)]], beta 0.5, k1:
    # row 0: [0 - .05, 0 - .1, 1 - .15] = [-.05, -.1, .85];  row 1: [0 - .2, 1 - .25, pad untouched 0]
    # kl mean: row means .2 and .45 -> .325
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    ref = torch.zeros(2, 3)
    lp = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    new, kl = apply_kl_in_reward(rewards, lp, ref, mask, beta=0.5, kind="k1")
    close(new, [[-0.05, -0.1, 0.85], [-0.2, 0.75, 0.0]])
    assert kl.item() == pytest.approx(0.325)


def test_fixed_controller_never_moves():
    c = FixedKLController(0.001)
    c.update(current_kl=5.0, n_steps=256)
    assert c.value == 0.001


def test_adaptive_controller_update_rule():
    # init .1, target .1, horizon 100, n_steps 10
    # kl .3 : e = clip(3 - 1) = +.2  -> .1 * (1 + .2*10/100) = .102
    # kl .05: e = clip(.5 - 1) = -.2 -> .102 * .98 = .09996
    # kl .11: e = .1                 -> .09996 * 1.01 = .1009596
    c = AdaptiveKLController(init_coef=0.1, target=0.1, horizon=100)
    c.update(0.3, 10)
    assert c.value == pytest.approx(0.102)
    c.update(torch.tensor(0.05), 10)
    assert c.value == pytest.approx(0.09996)
    c.update(0.11, 10)
    assert c.value == pytest.approx(0.1009596)


def test_adaptive_state_round_trip():
    c = AdaptiveKLController(0.1, 0.1, 100)
    c.update(0.3, 10)                                        # .102
    fresh = make_kl_controller("adaptive", 0.1, target=0.1, horizon=100)
    fresh.load_state_dict(c.state_dict())
    assert fresh.value == pytest.approx(0.102)


def test_fixed_state_keeps_configured_coefficient():
    saved = FixedKLController(0.001).state_dict()
    c = FixedKLController(0.002)
    c.load_state_dict(saved)
    assert c.value == 0.002


def test_switching_controller_kind_on_resume_is_refused():
    with pytest.raises(TinyRLError, match="adaptive"):
        FixedKLController(0.001).load_state_dict(AdaptiveKLController(0.1, 0.1, 100).state_dict())


def test_factory_validates():
    assert isinstance(make_kl_controller("fixed", 0.001), FixedKLController)
    with pytest.raises(TinyRLError, match="fixed, adaptive"):
        make_kl_controller("pid", 0.001)
    with pytest.raises(TinyRLError, match="horizon"):
        make_kl_controller("adaptive", 0.001, target=0.1, horizon=0)
    with pytest.raises(TinyRLError, match="target"):
        make_kl_controller("adaptive", 0.001, target=0.0)
