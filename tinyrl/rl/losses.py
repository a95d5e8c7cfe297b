"""Losses: PPO clipped policy loss (dual clip), clipped value loss, entropy, KL loss, aggregation.

Knows: per-token log-probs, advantages, values, returns, the response mask.
Does not know: models, optimizers, configs. Stats come back as detached 0-dim tensors (no GPU
sync here; the trainer decides when to call .item()). Names of stats are verl's.
Semantics: verl `core_algos.agg_loss / compute_policy_loss / compute_value_loss /
compute_entropy_loss` and `torch_functional.entropy_from_logits`.
"""

from __future__ import annotations

from typing import Callable

import torch

from tinyrl.errors import TinyRLError
from tinyrl.rl.kl import kl_penalty
from tinyrl.rl.masking import masked_mean, masked_var


def _token_mean(loss_mat, m, max_len):
    return masked_mean(loss_mat, m)


def _seq_mean_token_sum(loss_mat, m, max_len):
    return (loss_mat * m).sum(dim=-1).mean()


def _seq_mean_token_mean(loss_mat, m, max_len):
    # clamp: an empty row gives 0 instead of verl's NaN.
    return ((loss_mat * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1.0)).mean()


def _seq_mean_token_sum_norm(loss_mat, m, max_len):
    # Dr.GRPO, exactly as verl: the sum over ALL sequences' tokens divided by a constant length.
    # Despite the "seq-mean" in the name it is not divided by B, so its scale grows with the
    # (micro-)batch size; verl does the same, kept for comparable curves. Pass the configured max
    # response length as max_len: the padded T varies by batch and would make the scale drift.
    return (loss_mat * m).sum() / (loss_mat.shape[-1] if max_len is None else max_len)


LOSS_AGG_MODES: dict[str, Callable[..., torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", max_len: int | None = None) -> torch.Tensor:
    """Aggregate a [B, T] per-token loss into a scalar over the valid tokens."""
    fn = LOSS_AGG_MODES.get(mode)
    if fn is None:
        raise TinyRLError(f"unknown loss aggregation mode '{mode}'",
                          f"set actor.loss_agg_mode to one of: {', '.join(LOSS_AGG_MODES)}")
    return fn(loss_mat, mask.to(loss_mat.dtype), max_len)


def policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    agg_mode: str = "token-mean",
    max_len: int | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with dual clip. All inputs [B, T]. -> (scalar loss, stats)

    L = max(-A*r, -A*clip(r, 1-eps_low, 1+eps_high)); for A < 0 also min(L, -A*c), which bounds
    the loss when a bad action's ratio explodes (Ye et al. 2020, dual-clip PPO).
    `is_weights` (detached, [B, T]): the rollout importance-sampling correction
    (tinyrl.rl.rollout_is), multiplied into each token's loss before aggregation.
    """
    if not clip_ratio_c > 1.0:
        raise TinyRLError(f"dual-clip constant must be > 1, got {clip_ratio_c}", "set actor.clip_ratio_c = 3.0")
    m = mask.to(logprob.dtype)
    log_ratio = torch.clamp(logprob - old_logprob, min=-20.0, max=20.0)  # [B, T]; clamp keeps exp finite
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clipped = torch.maximum(loss1, loss2)                               # [B, T]
    loss3 = -advantages * clip_ratio_c
    dual = torch.minimum(clipped, loss3)
    per_token = torch.where(advantages < 0, dual, clipped)              # [B, T]
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(per_token.dtype)
    loss = agg_loss(per_token, m, agg_mode, max_len)
    with torch.no_grad():
        stats = {
            "pg_clipfrac": masked_mean((loss2 > loss1).to(m.dtype), m),
            # verl: mean of -(clamped log-ratio), i.e. old_lp - lp, the k1 KL(old || new) estimate
            "ppo_kl": masked_mean(-log_ratio, m),
            "pg_clipfrac_lower": masked_mean(((clipped > loss3) & (advantages < 0)).to(m.dtype), m),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float = 0.5,
    agg_mode: str = "token-mean",
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss `0.5 * agg(max((v-R)^2, (vclip-R)^2))`. All inputs [B, T]."""
    m = mask.to(values.dtype)
    v_clipped = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    loss1 = (values - returns) ** 2
    loss2 = (v_clipped - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(loss1, loss2), m, agg_mode, max_len)
    with torch.no_grad():
        stats = {"vf_clipfrac": masked_mean((loss2 > loss1).to(m.dtype), m)}
    return loss, stats


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: logsumexp(z) - sum softmax(z)*z. [..., V] -> [...]"""
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(dim=-1)


def kl_loss(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    mask: torch.Tensor,
    kind: str = "k3",
    agg_mode: str = "token-mean",
    max_len: int | None = None,
) -> torch.Tensor:
    """KL to the reference as a loss term (GRPO style). [B, T] inputs -> scalar."""
    return agg_loss(kl_penalty(logprob, ref_logprob, kind), mask.to(logprob.dtype), agg_mode, max_len)


def actor_loss(
    pg_loss: torch.Tensor,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Total actor loss = pg_loss - entropy_coef * entropy + kl_coef * kl (scalars).

    The KL term is ADDED: minimising the loss must pull the policy toward the reference.
    TinyZero's actor subtracts coef * kl_loss, a sign bug that pushes the policy AWAY from the
    reference; verl upstream adds it, as here (ALGORITHMS.md, "KL").
    """
    loss = pg_loss
    if entropy is not None:
        loss = loss - entropy_coef * entropy
    if kl is not None:
        loss = loss + kl_coef * kl
    return loss


def actor_objective(
    logprob: torch.Tensor,
    entropy: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprob: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    agg_mode: str = "token-mean",
    max_len: int | None = None,
    entropy_coef: float = 0.0,
    kl_coef: float = 0.0,
    kl_type: str = "k3",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The actor's whole loss, exactly as the trainer back-propagates it. [B, T] inputs -> scalar.

    policy_loss (with the rollout IS weights) - entropy_coef * agg(entropy)
    + kl_coef * kl_loss(logprob, ref_logprob) when ref_logprob is given (KL as a loss).
    """
    pg, stats = policy_loss(logprob, old_logprob, advantages, mask, eps_low=eps_low, eps_high=eps_high,
                            clip_ratio_c=clip_ratio_c, agg_mode=agg_mode, max_len=max_len,
                            is_weights=is_weights)
    ent = agg_loss(entropy, mask.to(entropy.dtype), agg_mode, max_len)
    kl = None if ref_logprob is None else kl_loss(logprob, ref_logprob, mask, kl_type, agg_mode, max_len)
    loss = actor_loss(pg, ent if entropy_coef else None, entropy_coef, kl, kl_coef)
    stats = {"pg_loss": pg.detach(), "entropy": ent.detach(), **stats}
    if kl is not None:
        stats["kl_loss"] = kl.detach()
    return loss, stats


@torch.no_grad()
def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(R - V) / (Var(R) + 1e-5) over valid tokens (verl's critic/vf_explained_var). -> scalar"""
    m = mask.to(values.dtype)
    return 1.0 - masked_var(returns - values, m) / (masked_var(returns, m) + 1e-5)


def sft_loss(logprob: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Supervised fine-tuning: the token-mean negative log-likelihood of the target tokens.

    logprob [B, T]: log-prob of each target token; loss_mask [B, T]: 1 where the token is
    trained (a response, or an assistant turn), 0 elsewhere (prompt, user/tool turns, padding).
    Positions outside the mask do not reach the loss or its gradient, whatever their log-prob.
    -> (loss, {"loss"}); verl's SFT trainer takes the same token mean over its loss mask.
    """
    loss = masked_mean(-logprob, loss_mask)
    return loss, {"loss": loss.detach()}
