"""The phases of a training step: ONE list of names, used by the trainer, micro-batching, the
memory plan, cost, the run log and the dashboard.

A step runs SYNC -> ROLLOUT -> REWARD -> FORWARD -> ADVANTAGES -> ACTOR_UPDATE -> CRITIC_UPDATE;
VALIDATE and CHECKPOINT happen between steps. FORWARD is every no-grad pass over the rollout:
old (actor) and reference (adapters off) log-probs, and the critic's values when there is one.
"""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    SYNC = "sync"                    # wake the engine, push the actor's weights/adapter
    ROLLOUT = "rollout"              # the engine samples; vLLM sleeps afterwards
    REWARD = "reward"                # the task's reward scores each completion
    FORWARD = "forward"              # no-grad: old + reference log-probs, values
    ADVANTAGES = "advantages"        # KL in reward, then the advantage estimator
    ACTOR_UPDATE = "actor_update"    # policy loss, mini/micro-batched
    CRITIC_UPDATE = "critic_update"  # value loss (PPO with a critic only)
    VALIDATE = "validate"            # greedy rollouts on held-back prompts
    CHECKPOINT = "checkpoint"        # save adapters/weights, optimizers, RNG

    def __str__(self) -> str:  # f"{Phase.ROLLOUT}" -> "rollout" on every Python version
        return self.value


STEP_PHASES = (Phase.SYNC, Phase.ROLLOUT, Phase.REWARD, Phase.FORWARD, Phase.ADVANTAGES,
               Phase.ACTOR_UPDATE, Phase.CRITIC_UPDATE)
BETWEEN_STEPS = (Phase.VALIDATE, Phase.CHECKPOINT)  # after step N: the run log files them under N
# The phases whose memory the plan checks (each gets the card in turn) and that have a
# micro-batch token budget (all but ROLLOUT).
PLANNED_PHASES = (Phase.ROLLOUT, Phase.FORWARD, Phase.ACTOR_UPDATE, Phase.CRITIC_UPDATE)
BUDGETED_PHASES = (Phase.FORWARD, Phase.ACTOR_UPDATE, Phase.CRITIC_UPDATE)
