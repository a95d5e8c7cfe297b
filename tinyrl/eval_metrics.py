"""Evaluation metrics over n samples per problem: pure functions, hand-checked in tests.

pass@k: the unbiased estimator of Chen et al. 2021 (Codex), 1 - C(n-c, k) / C(n, k) per problem
(the chance that k of the n samples, drawn without replacement, hold a correct one), averaged
over problems. maj@k: the most frequent extracted answer of the first k samples (ties: the one
seen first) is the problem's answer; correct when a sample giving it is correct. So maj@1 is the
first sample's correctness, where pass@1 (= mean@n) averages all n. mean@n: the mean
correctness of all samples.
"""

from __future__ import annotations

from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k)/C(n, k) for one problem with c correct of n samples (k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def maj_at_k(answers: list[str | None], correct: list[bool], k: int) -> bool:
    """Majority vote over the first k samples' answers (None = no answer, never a vote)."""
    votes: dict[str, int] = {}
    first_ok: dict[str, bool] = {}
    for answer, ok in zip(answers[:k], correct[:k]):
        if answer is None:
            continue
        key = "".join(answer.split())
        votes[key] = votes.get(key, 0) + 1
        first_ok.setdefault(key, ok)
    if not votes:
        return False
    best = max(votes.values())
    winner = next(key for key in votes if votes[key] == best)  # dicts keep first-seen order
    return first_ok[winner]


def summarize(per_problem: list[tuple[list[str | None], list[bool]]], ks: list[int]) -> dict[str, float]:
    """Per problem (answers, correct flags) of n samples each -> mean@n, pass@k, maj@k."""
    if not per_problem:
        return {}
    n = len(per_problem[0][1])
    out = {f"mean@{n}": sum(sum(c) / n for _, c in per_problem) / len(per_problem)}
    for k in ks:
        if k > n:
            continue
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(c), k) for _, c in per_problem) / len(per_problem)
        out[f"maj@{k}"] = sum(maj_at_k(a, c, k) for a, c in per_problem) / len(per_problem)
    return out
