"""Advantage estimators: GAE (PPO with a critic), GRPO, Dr.GRPO, RLOO, REINFORCE++.

Knows: token rewards / sequence scores, critic values, prompt-group ids, the response mask.
Does not know: models, configs, how scores were computed.
Every estimator returns `(advantages [B, T], returns [B, T])`, both 0 outside the mask, and
carries no autograd history (advantages are constants for the policy loss).
Semantics: verl `verl/trainer/ppo/core_algos.py`; deviations are marked "deviation".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

import torch

from tinyrl.errors import TinyRLError
from tinyrl.rl.masking import masked_whiten
from tinyrl.roles import ESTIMATORS, estimator

GroupIds = torch.Tensor | Sequence  # [B] ints, or any hashables (verl uses uid strings)


def group_index(group_ids: GroupIds, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """Map group ids ([B] tensor or sequence of hashables) to dense ints 0..G-1. -> ([B] long, G)"""
    if isinstance(group_ids, torch.Tensor):
        uniq, inverse = torch.unique(group_ids, return_inverse=True)
        return inverse.to(device or group_ids.device), uniq.numel()
    first_seen: dict = {}
    dense = [first_seen.setdefault(g, len(first_seen)) for g in group_ids]
    return torch.tensor(dense, dtype=torch.long, device=device), len(first_seen)


def _float_scores(scores: torch.Tensor) -> torch.Tensor:
    # Integer rewards would make the group mean round; work in fp32 at least.
    return scores if scores.is_floating_point() else scores.to(torch.float32)


def _group_stats(scores: torch.Tensor, group_ids: GroupIds) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (group mean, group unbiased std, group size), each [B]."""
    s = _float_scores(scores)                                          # [B]
    idx, n_groups = group_index(group_ids, s.device)                   # [B]
    count = torch.zeros(n_groups, dtype=s.dtype, device=s.device).index_add_(0, idx, torch.ones_like(s))
    mean = torch.zeros(n_groups, dtype=s.dtype, device=s.device).index_add_(0, idx, s) / count
    sq = torch.zeros(n_groups, dtype=s.dtype, device=s.device).index_add_(0, idx, (s - mean[idx]) ** 2)
    std = (sq / (count - 1).clamp(min=1.0)).sqrt()
    return mean[idx], std[idx], count[idx]


def place_sequence_reward(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Put each sequence score on its LAST valid response token. scores [B], mask [B, T] -> [B, T]

    With the trajectory's mask that is the last token the POLICY sampled, also when a tool turn
    follows it: the estimators skip inserted tokens, so a reward there would be lost.
    A row with no valid token gets no reward (there is no token to credit).
    """
    s = _float_scores(scores)
    B, T = mask.shape
    valid = mask.to(torch.bool)                                         # [B, T]
    pos = torch.arange(T, device=mask.device).expand(B, T)              # [B, T]
    # Last valid index = max position among valid ones (works for any mask, not only right padding).
    last = torch.where(valid, pos, torch.full_like(pos, -1)).max(dim=-1).values  # [B]
    out = torch.zeros(B, T, dtype=s.dtype, device=s.device)
    has = last >= 0
    out[torch.arange(B, device=mask.device)[has], last[has]] = s[has]
    return out


@torch.no_grad()
def gae_advantages(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over response tokens; returns = A + V (before whitening); A whitened over valid tokens.

    token_rewards, values, mask: [B, T]. Invalid tokens are skipped by the recursion (verl's
    multi-turn form), so V after the last valid token is 0 and padding never leaks in. The
    same skip handles inserted context (a tool turn: policy_mask 0 inside the episode): the
    last policy token before it bootstraps from V at the next policy token after it, and
    gamma/lam apply once per policy step, never per inserted token; values and rewards at
    inserted tokens never enter (verl 0.9.1 `compute_gae_advantage_return`, "skip values and
    TD-error on observation tokens"). A reward must therefore sit on a policy token:
    place_sequence_reward puts the score on the last one (verl puts it on the last token of the
    attention mask, where this recursion would drop it if the episode ended in a tool turn).
    """
    m = mask.to(values.dtype)                                           # [B, T]
    next_value = torch.zeros_like(values[:, 0])                         # [B]
    last_gae = torch.zeros_like(values[:, 0])                           # [B]
    adv = torch.zeros_like(values)                                      # [B, T]
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        # Invalid token: carry the successor's value and advantage through unchanged.
        next_value = values[:, t] * m[:, t] + next_value * (1 - m[:, t])
        last_gae = gae_t * m[:, t] + last_gae * (1 - m[:, t])
        adv[:, t] = last_gae
    returns = (adv + values) * m
    return masked_whiten(adv, m), returns


@torch.no_grad()
def grpo_advantages(
    scores: torch.Tensor, group_ids: GroupIds, mask: torch.Tensor, norm_by_std: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group `(s - mean) / (std + eps)` (unbiased std); norm_by_std=False is Dr.GRPO `s - mean`.

    scores [B], mask [B, T]. A group of one uses mean 0, std 1 (as verl: its advantage is its
    own score). Broadcast over valid tokens; returns = advantages.
    """
    s = _float_scores(scores)                                           # [B]
    mean, std, count = _group_stats(s, group_ids)                       # [B] each
    single = count < 2
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    a = (s - mean) / (std + eps) if norm_by_std else s - mean           # [B]
    adv = a[:, None] * mask.to(a.dtype)                                 # [B, T]
    return adv, adv.clone()


@torch.no_grad()
def rloo_advantages(scores: torch.Tensor, group_ids: GroupIds, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`A_i = s_i - mean of the other n-1 scores in its group`, broadcast over valid tokens.

    Deviation: verl leaves a group of one at its raw score; here it gets 0 (there is no other
    sample to form a baseline, and the spec asks for an unbiased leave-one-out estimate).
    """
    s = _float_scores(scores)                                           # [B]
    mean, _, count = _group_stats(s, group_ids)                         # [B]
    # s - (sum - s)/(n - 1) == (s - mean) * n / (n - 1)
    a = torch.where(count > 1, (s - mean) * count / (count - 1).clamp(min=1.0), torch.zeros_like(s))
    adv = a[:, None] * mask.to(a.dtype)                                 # [B, T]
    return adv, adv.clone()


@torch.no_grad()
def reinforce_pp_advantages(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: returns G_t = sum_k gamma^k r_{t+k} over valid tokens; A = whiten(G).

    token_rewards, mask: [B, T]. Rewards outside the mask are ignored, and invalid tokens are
    skipped: the running return passes through an inserted span (a tool turn) unchanged, so the
    tokens before it still see the reward after it, discounted per policy token (verl 0.9.1
    `compute_reinforce_plus_plus_outcome_advantage` does the same; right padding is a span
    with nothing after it, so its return stays 0).
    """
    m = mask.to(token_rewards.dtype if token_rewards.is_floating_point() else torch.float32)
    r = token_rewards * m                                               # [B, T]
    returns = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])                                 # [B]
    for t in reversed(range(r.shape[1])):
        running = torch.where(m[:, t] > 0, r[:, t] + gamma * running, running)
        returns[:, t] = running * m[:, t]
    return masked_whiten(returns, m), returns


def _need(name: str, what: str, value, hint: str):
    if value is None:
        raise TinyRLError(f"advantage estimator '{name}' needs {what}, got none", hint)
    return value


def _scores_of(name: str, scores, token_rewards, mask) -> torch.Tensor:
    # GRPO-style estimators read one score per sequence; verl derives it as the token-reward sum
    # (which includes any in-reward KL). Accept either.
    if scores is not None:
        return scores
    r = _need(name, "scores or token_rewards", token_rewards, "pass the sequence scores [B]")
    return (r * mask.to(r.dtype)).sum(dim=-1)


def _token_rewards_of(name: str, scores, token_rewards, mask) -> torch.Tensor:
    if token_rewards is not None:
        return token_rewards
    return place_sequence_reward(_need(name, "token_rewards or scores", scores, "pass token rewards [B, T]"), mask)


def _gae(*, token_rewards, scores, values, group_ids, mask, gamma, lam):
    v = _need("gae", "critic values", values, "GAE needs a critic; or set algorithm.adv_estimator = grpo")
    return gae_advantages(_token_rewards_of("gae", scores, token_rewards, mask), v, mask, gamma, lam)


def _grpo_like(name: str, norm_by_std: bool):
    def run(*, token_rewards, scores, values, group_ids, mask, gamma, lam):
        ids = _need(name, "group ids", group_ids, "pass the prompt index of each sample (n samples per prompt)")
        return grpo_advantages(_scores_of(name, scores, token_rewards, mask), ids, mask, norm_by_std=norm_by_std)

    return run


def _rloo(*, token_rewards, scores, values, group_ids, mask, gamma, lam):
    ids = _need("rloo", "group ids", group_ids, "pass the prompt index of each sample (n samples per prompt)")
    return rloo_advantages(_scores_of("rloo", scores, token_rewards, mask), ids, mask)


def _reinforce_pp(*, token_rewards, scores, values, group_ids, mask, gamma, lam):
    return reinforce_pp_advantages(_token_rewards_of("reinforce_pp", scores, token_rewards, mask), mask, gamma)


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "gae": _gae,
    "grpo": _grpo_like("grpo", norm_by_std=True),
    "dr_grpo": _grpo_like("dr_grpo", norm_by_std=False),
    "rloo": _rloo,
    "reinforce_pp": _reinforce_pp,
}

# The estimators' names and what each needs (a critic, groups) live in tinyrl.roles, which the
# config, trainer, memory plan, cost, export-verl and doctor read; this table must match it.
if set(ADVANTAGE_ESTIMATORS) != set(ESTIMATORS):
    raise ImportError(f"tinyrl.rl.advantages dispatches {sorted(ADVANTAGE_ESTIMATORS)} but tinyrl.roles "
                      f"lists {sorted(ESTIMATORS)}: add the estimator to both")


def compute_advantages(
    name: str,
    *,
    mask: torch.Tensor,
    token_rewards: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    group_ids: GroupIds | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch by estimator name. -> (advantages [B, T], returns [B, T])

    gae / reinforce_pp read token_rewards [B, T] (or place `scores` on the last token);
    grpo / dr_grpo / rloo read scores [B] (or sum token_rewards) and group_ids [B].
    """
    estimator(name)  # an unknown name: TinyRLError with the valid ones
    return ADVANTAGE_ESTIMATORS[name](
        token_rewards=token_rewards, scores=scores, values=values, group_ids=group_ids,
        mask=mask, gamma=gamma, lam=lam,
    )
