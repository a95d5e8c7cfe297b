"""How tinyrl says a count in a sentence; imports nothing, so the dashboard's render thread and
the data commands use the same words."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """'1 row', '2 rows', '1,024 rows': a count and its noun, plural unless the count is one."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
