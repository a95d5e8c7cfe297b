"""The KL estimators' names: ONE table, ours and verl's.

verl 0.9.1 accepts these names (verl/trainer/ppo/core_algos.py, kl_penalty_forward): "kl" and
"k1", "abs", "mse" and "k2", "low_var_kl" and "k3" ("full" raises NotImplementedError; a "+"
suffix, e.g. "k3+", adds a straight-through k2 gradient, which tinyrl does not do). Each name maps
to the estimator it computes. tinyrl.rl.kl holds the math and checks at import that its table
has exactly these estimators. Torch-free on purpose: config validation imports it.
"""

from __future__ import annotations

KL_ALIASES: dict[str, str] = {
    "k1": "k1", "kl": "k1",            # log p - log p_ref
    "abs": "abs",                      # |log p - log p_ref|
    "k2": "k2", "mse": "k2",           # 0.5 (log p - log p_ref)^2
    "k3": "k3", "low_var_kl": "k3",    # Schulman's low-variance estimator
}
KL_NAMES = tuple(KL_ALIASES)
