"""How tinyrl says a count in a sentence; imports nothing, so the dashboard's render thread and
the data commands use the same words."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """'1 row', '2 rows', '1,024 rows': a count and its noun, plural unless the count is one."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def step_ranges(steps) -> str:
    """'3-8', '1, 4-6, 9': integer steps said as runs (sorted, each once)."""
    runs: list[list[int]] = []
    for s in sorted(set(int(x) for x in steps)):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
