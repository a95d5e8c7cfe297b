"""The roles a run has, and the advantage estimators that decide them: ONE table.

Knows: the estimator names, which of them read a critic's values (only GAE), which compare
the samples of one prompt (they need rollout.n >= 2) and which discount (gamma, lam); which
roles an algorithm builds.
Does not know: the estimators' math (tinyrl.rl.advantages dispatches on these names and checks
at import that its table has exactly these), models, configs beyond two booleans.
Torch-free on purpose: config validation and `tinyrl presets` import it without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tinyrl.errors import TinyRLError


class Role(str, Enum):
    ACTOR = "actor"          # the policy: always trained
    CRITIC = "critic"        # the value model: only for estimators that read values
    REFERENCE = "reference"  # the frozen start, for a KL term: adapters off (LoRA) or a copy (full)

    def __str__(self) -> str:  # f"{Role.ACTOR}" -> "actor" on every Python version
        return self.value


@dataclass(frozen=True)
class Estimator:
    critic: bool   # reads a value model's V(s) (GAE): the run builds, trains and saves a critic
    grouped: bool  # compares the samples of one prompt: needs rollout.n >= 2
    discount: tuple[str, ...] = ()  # the algorithm.* discount settings it reads (gamma, lam)


ESTIMATORS: dict[str, Estimator] = {
    "gae": Estimator(critic=True, grouped=False, discount=("gamma", "lam")),
    "grpo": Estimator(critic=False, grouped=True),
    "dr_grpo": Estimator(critic=False, grouped=True),
    "rloo": Estimator(critic=False, grouped=True),
    "reinforce_pp": Estimator(critic=False, grouped=False, discount=("gamma",)),
}
ESTIMATOR_NAMES = tuple(ESTIMATORS)


def estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise TinyRLError(f"unknown advantage estimator '{name}'",
                          f"set algorithm.adv_estimator to one of: {', '.join(ESTIMATORS)}")
    return ESTIMATORS[name]


def needs_critic(name: str) -> bool:
    """True when the estimator reads critic values (only GAE)."""
    return estimator(name).critic


def run_roles(adv_estimator: str, uses_kl: bool) -> frozenset[Role]:
    """The roles an RL run builds: the actor; the critic when the estimator reads values; the
    reference when a KL term reads its log-probs (kl_in_reward or use_kl_loss)."""
    roles = {Role.ACTOR}
    if needs_critic(adv_estimator):
        roles.add(Role.CRITIC)
    if uses_kl:
        roles.add(Role.REFERENCE)
    return frozenset(roles)
