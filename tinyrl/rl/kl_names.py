"""The KL estimators' names: ONE table, ours and verl's.

verl 0.9.1 accepts these names (verl/trainer/ppo/core_algos.py, kl_penalty and
kl_penalty_forward): "kl" and "k1", "abs", "mse" and "k2", "low_var_kl" and "k3", each also with
a "+" suffix, and "full". Each name maps to the estimator it computes; a "+" name is verl's
straight-through variant (tinyrl.rl.kl computes it the same way). "full" is refused with its
reason (KL_REFUSED). tinyrl.rl.kl holds the math and checks at import that its table has exactly
these estimators. Torch-free on purpose: config validation imports it.
"""

from __future__ import annotations

from tinyrl.errors import TinyRLError

KL_ALIASES: dict[str, str] = {
    "k1": "k1", "kl": "k1",            # log p - log p_ref
    "abs": "abs",                      # |log p - log p_ref|
    "k2": "k2", "mse": "k2",           # 0.5 (log p - log p_ref)^2
    "k3": "k3", "low_var_kl": "k3",    # Schulman's low-variance estimator
}
# verl's suffix: "k3+" has k3's value and k2's gradient (log p - log p_ref), the one of the
# estimators whose expected gradient is the KL's (verl's kl_penalty docstring).
STRAIGHT_THROUGH = "+"
KL_NAMES = tuple(KL_ALIASES) + tuple(name + STRAIGHT_THROUGH for name in KL_ALIASES)

_FULL = ("is the KL over the whole vocabulary, which needs every token's log-prob under both models "
         "(tinyrl keeps only the sampled token's, and verl 0.9.1 itself raises NotImplementedError "
         "for it); use k3 (low_var_kl), an estimate from the sampled tokens, or k3+ for k2's gradient")
KL_REFUSED: dict[str, str] = {"full": _FULL, "full" + STRAIGHT_THROUGH: _FULL}
"""verl's names tinyrl cannot compute -> why, said instead of the list of names."""


def kl_estimator(name: str) -> tuple[str, bool]:
    """verl's or our name -> (estimator of KL_ALIASES, straight-through?)."""
    if name in KL_REFUSED:
        raise TinyRLError(f"KL estimator '{name}' {KL_REFUSED[name]}",
                          "set algorithm.kl_penalty / algorithm.kl_loss_type to k3")
    if name not in KL_NAMES:
        raise TinyRLError(f"unknown KL estimator '{name}'",
                          f"set algorithm.kl_penalty / algorithm.kl_loss_type to one of: {', '.join(KL_NAMES)}")
    straight = name.endswith(STRAIGHT_THROUGH)
    return KL_ALIASES[name.removesuffix(STRAIGHT_THROUGH)], straight
