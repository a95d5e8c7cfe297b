"""Truncated importance sampling for the gap between the rollout engine and the trainer.

The engine (vLLM) samples with its own kernels and precision, and after a failed sync from
stale weights; the PPO ratio is taken against the trainer's old log-probs, so each token's
policy-gradient term is re-weighted by how much likelier the trainer found it than the engine:
    token:    w_t = min(exp(lp_old_t - lp_roll_t), C)
    sequence: w   = min(exp(sum_t (lp_old_t - lp_roll_t)), C), broadcast over the sequence
(verl `rollout_corr_helper` "truncate" mode; TRL/OpenRLHF "tis"). Weights are detached: they
scale the loss, they are not trained through. ALGORITHMS.md, "Rollout importance-sampling".

Knows: log-probs and masks. Does not know: engines, configs.
"""

from __future__ import annotations

import torch

from tinyrl.rl.masking import masked_mean

LEVELS = ("token", "sequence")
_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: far above any cap, and finite in bf16/fp16


@torch.no_grad()
def rollout_is_weights(old_logprob: torch.Tensor, rollout_logprob: torch.Tensor, mask: torch.Tensor,
                       level: str = "token", cap: float = 2.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """[B, T] trainer and engine log-probs of the sampled tokens -> (weights [B, T], stats).

    Padding gets weight 0. stats: "rollout_is/mean" (mean weight over valid tokens) and
    "rollout_is/clip_frac" (share of valid tokens, or of sequences at sequence level, whose
    ratio was above the cap).
    """
    m = mask.to(torch.float32)
    log_ratio = (old_logprob.float() - rollout_logprob.float()) * m           # [B, T]
    if level == "token":
        log_w = log_ratio
        over = (log_w > torch.log(torch.tensor(cap))).float()
        clip_frac = masked_mean(over, m)
    elif level == "sequence":
        log_w = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)      # [B, T]
        over_seq = (log_w[:, 0] > torch.log(torch.tensor(cap))).float()      # [B]
        has_tokens = (m.sum(-1) > 0).float()
        clip_frac = (over_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)
    else:
        raise ValueError(f"unknown rollout IS level {level!r}; choose from {LEVELS}")
    weights = torch.exp(log_w.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)).clamp(max=cap) * m
    return weights, {"rollout_is/mean": masked_mean(weights, m), "rollout_is/clip_frac": clip_frac}


@torch.no_grad()
def probs_diff(old_logprob: torch.Tensor, rollout_logprob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """mean |p_trainer - p_engine| over valid tokens: the parity guard's measure (a scalar)."""
    return masked_mean((old_logprob.float().exp() - rollout_logprob.float().exp()).abs(), mask.to(torch.float32))
