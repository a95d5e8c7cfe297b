"""The data a step passes from phase to phase: one typed object, sliced by rows in one place.

Filled in phase order: the rollout gives the batch, the engine's log-probs and the group ids;
FORWARD adds old/reference log-probs and values; REWARD the scores; ADVANTAGES the
advantages, returns and rollout IS weights. Everything is [B, R] (response-aligned) unless said.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tinyrl.models import Batch, make_batch
from tinyrl.rollout.base import Episode


@dataclass
class Trajectory:
    batch: Batch                              # prompt + response ids, masks
    group_ids: torch.Tensor                   # [B] which prompt each sample answers
    rollout_lp: torch.Tensor | None = None    # the engine's log-prob of each sampled token
    old_lp: torch.Tensor | None = None        # the actor's, before this step's update (no grad)
    ref_lp: torch.Tensor | None = None        # the reference's (adapters off); only when a KL needs it
    values: torch.Tensor | None = None        # the critic's V(s) (PPO with a critic only)
    scores: torch.Tensor | None = None        # [B] sequence rewards (+ shaping)
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None    # rollout IS weights; None = no correction

    @property
    def mask(self) -> torch.Tensor:
        """[B, R] 1 = a real token the policy sampled. The ONE mask of every RL term: log-probs,
        ratios, KL (loss and in-reward), entropy, loss aggregation, rollout IS weights, the
        parity guard, values, GAE and whitening. Inserted context (tool output) is 0 here."""
        return self.batch.trained_mask

    def __len__(self) -> int:
        return self.batch.input_ids.shape[0]

    def rows(self, index: torch.Tensor | slice) -> "Trajectory":
        """The same trajectory restricted to some rows (a mini- or micro-batch)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.rows(index) if isinstance(value, Batch) else None if value is None else value[index]
        return Trajectory(**out)


def trajectory_of(episodes: list[Episode], pad_id: int, device: torch.device) -> Trajectory:
    """The ROLLOUT phase's output as a Trajectory: the padded batch and the group ids."""
    batch = make_batch([e.prompt_ids for e in episodes], [e.response_ids for e in episodes], pad_id,
                       [e.policy_mask for e in episodes]).to(device)
    return Trajectory(batch=batch, group_ids=torch.tensor([e.prompt_index for e in episodes], device=device))


def engine_logprobs(episodes: list[Episode], like: torch.Tensor) -> torch.Tensor | None:
    """The engine's per-token log-probs as a [B, R] tensor shaped like `like` (0 on padding and,
    by Episode's convention, on inserted tokens); None when the engine gave none."""
    if any(e.logprobs is None for e in episodes):
        return None
    out = torch.zeros_like(like, dtype=torch.float32)
    for i, e in enumerate(episodes):
        out[i, :len(e.logprobs)] = torch.tensor(e.logprobs, dtype=torch.float32)
    return out
