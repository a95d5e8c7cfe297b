"""KL(pi || ref) per token (k1, abs, k2, k3), KL in the reward, and the KL coefficient controllers.

Knows: policy and reference log-probs of the sampled tokens, the response mask.
Does not know: models, configs. The controllers are the only state here (one float), kept
because verl's PPO loop updates the coefficient between steps; they checkpoint by state_dict.
Semantics: verl `core_algos.kl_penalty`, `AdaptiveKLController`, `FixedKLController`,
`ray_trainer.apply_kl_penalty`.
"""

from __future__ import annotations

from typing import Callable

import torch

from tinyrl.errors import TinyRLError
from tinyrl.rl.kl_names import KL_ALIASES, kl_estimator
from tinyrl.rl.masking import masked_mean


def _k1(lp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return lp - ref


def _abs(lp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (lp - ref).abs()


def _k2(lp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return 0.5 * (lp - ref).square()


def _k3(lp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    # Schulman's low-variance unbiased estimator; the clamps (verl's) keep exp() finite when the
    # policy has drifted far from the reference on one token.
    k = torch.clamp(ref - lp, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(k) - k - 1.0, min=-10.0, max=10.0)


_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _k1, "abs": _abs, "k2": _k2, "k3": _k3,
}
if set(_ESTIMATORS) != set(KL_ALIASES.values()):  # every name (verl's too) is an alias of one of these
    raise ImportError(f"tinyrl.rl.kl computes {sorted(_ESTIMATORS)} but tinyrl.rl.kl_names names "
                      f"{sorted(set(KL_ALIASES.values()))}: make them agree")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL estimate. logprob, ref_logprob: [B, T] -> [B, T] (no masking).

    A name ending in "+" (verl's, e.g. "k3+") has its estimator's value and k2's gradient.
    """
    estimator, straight_through = kl_estimator(kind)
    value = _ESTIMATORS[estimator](logprob, ref_logprob)
    if not straight_through:
        return value
    # verl's `backward - backward.detach() + forward.detach()`: zero plus the value forward, only
    # k2's term differentiable; k1's and k3's own gradients are not the KL's in expectation.
    k2 = _k2(logprob, ref_logprob)
    return k2 - k2.detach() + value.detach()


@torch.no_grad()
def apply_kl_in_reward(
    token_rewards: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    kind: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """r_t - beta * kl_t on every valid token. All [B, T] -> (new rewards [B, T], kl scalar).

    `logprob` is the rollout policy's (verl passes old_log_probs). The returned KL is verl's
    `current_kl`: the mean over sequences of each sequence's per-token mean KL, which is what
    the adaptive controller is fed.
    """
    m = mask.to(logprob.dtype)
    kl = kl_penalty(logprob, ref_logprob, kind) * m                     # [B, T]
    new_rewards = token_rewards - beta * kl                             # [B, T]
    kl_mean = masked_mean(kl, m, dim=-1).mean()                         # scalar
    return new_rewards, kl_mean


class FixedKLController:
    """A constant coefficient; `update` is a no-op."""

    kind = "fixed"

    def __init__(self, coef: float):
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        _check_kind(self.kind, state)
        # Nothing was learned: the configured coefficient stays the truth on resume, so a user
        # can change kl_coef between runs.


class AdaptiveKLController:
    """Ziegler et al. 2019: `e = clip(kl/target - 1, -0.2, 0.2); beta *= 1 + e * n_steps / horizon`."""

    kind = "adaptive"

    def __init__(self, init_coef: float, target: float, horizon: float):
        if not target > 0:
            raise TinyRLError(f"adaptive KL target must be > 0, got {target}", "set algorithm.kl_target, e.g. 0.1")
        if not horizon > 0:
            raise TinyRLError(f"adaptive KL horizon must be > 0, got {horizon}", "set algorithm.kl_horizon, e.g. 10000")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        _check_kind(self.kind, state)
        # Only the learned coefficient is state; target and horizon come from the config.
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController


def _check_kind(kind: str, state: dict) -> None:
    if state.get("kind") != kind:
        raise TinyRLError(
            f"checkpoint holds a '{state.get('kind')}' KL controller, the config asks for '{kind}'",
            f"set algorithm.kl_ctrl = {state.get('kind')} to resume this run",
        )


def make_kl_controller(kind: str, coef: float, target: float = 0.1, horizon: float = 10_000) -> KLController:
    """`fixed` or `adaptive` controller from a name."""
    if kind == "fixed":
        return FixedKLController(coef)
    if kind == "adaptive":
        return AdaptiveKLController(coef, target, horizon)
    raise TinyRLError(f"unknown KL controller '{kind}'", "set algorithm.kl_ctrl to one of: fixed, adaptive")
