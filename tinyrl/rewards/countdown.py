"""Countdown reward, TinyZero semantics (shared/ALGORITHMS.md), made safe for any string.

0 when no `<answer>...</answer>` is found; `format_score` when an answer is found but is wrong in
any way; `score` when it uses each given number exactly once and evaluates to the target.

Deliberate differences from TinyZero's `verl/utils/reward_score/countdown.py`:
- TinyZero calls `eval` after a character whitelist that lets `**` through (`9**9**9**9` never
  returns). Here a small AST walker evaluates int literals, + - * /, unary +/- and parentheses
  only, with exact `Fraction` arithmetic and a size bound. So `**`, `//` and decimal literals
  such as `1.5` (digits glued into a new number) score `format_score`, where TinyZero may give 1.
- Extraction is a linear scan equivalent to `re.finditer(r"<answer>(.*?)</answer>")`: the regex
  is quadratic on inputs full of unclosed `<answer>` tags.
- Non-strict (default) reads the response only and takes the last answer anywhere in it.
  `strict=True` keeps TinyZero's extraction (cut at the first "Assistant:", then the LAST LINE
  only), so a correct answer followed by a newline scores 0 there, as it does in TinyZero.
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction
from typing import Any

from tinyrl.errors import TinyRLError

MAX_EXPR_CHARS = 512  # a 4-number answer needs ~20 characters; this is generous
MAX_NODES = 1024  # 512 characters cannot make more; a second fence costs nothing
_TOLERANCE = Fraction(1, 100_000)  # TinyZero's `abs(result - target) < 1e-5`

# TinyZero's whitelist `[\d+\-*/().\s]`, ASCII only so unicode digits and spaces fail here.
_ALLOWED = re.compile(r"[0-9+\-*/().\s]+", re.ASCII)
_NUMBER = re.compile(r"\d+", re.ASCII)  # TinyZero's multiset check, ASCII digits only
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_OPEN, _CLOSE = "<answer>", "</answer>"


class _Rejected(Exception):
    """The expression uses something outside the grammar."""


def last_answer(text: str) -> str | None:
    """Content of the last `<answer>...</answer>` pair, as `re.finditer` with `(.*?)` finds them."""
    found, pos = None, 0
    while (start := text.find(_OPEN, pos)) != -1:
        end = text.find(_CLOSE, start + len(_OPEN))
        if end == -1:  # no later opening tag can be closed either
            break
        found, pos = text[start + len(_OPEN):end], end + len(_CLOSE)
    return found


def _strict_region(solution_str: str) -> str | None:
    """TinyZero: keep what follows the first assistant marker, then only the last line."""
    for marker in ("Assistant:", "<|im_start|>assistant"):
        if marker in solution_str:
            return solution_str.split(marker, 1)[1].rsplit("\n", 1)[-1]
    return None


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    # bool is an int subclass, but `True` cannot get past the character whitelist anyway
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise _Rejected(type(node).__name__)


def evaluate_expression(expr: str) -> Fraction | None:
    """Exact value of an arithmetic expression, or None when it is not one we accept."""
    if len(expr) > MAX_EXPR_CHARS or not _ALLOWED.fullmatch(expr):
        return None
    # Collapse whitespace: a multi-line answer would otherwise be a SyntaxError in eval mode.
    expr = " ".join(expr.split())
    try:
        tree = ast.parse(expr, mode="eval")
        if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
            return None
        return _evaluate(tree)
    except (SyntaxError, RecursionError, MemoryError, ValueError, ZeroDivisionError, _Rejected):
        return None


_SHAPE = '{"target": int, "numbers": [int, ...]}'


def _what_is_wrong(ground_truth: Any) -> str:
    """Why unpack_truth could not read a ground truth, in the file's terms (it said Python's own,
    e.g. "TypeError: string indices must be integers", for a maths row's answer '42')."""
    shown = f"{ground_truth!r:.120}"
    if ground_truth is None:
        return f"it is missing (None), where countdown's is {_SHAPE}"
    if not hasattr(ground_truth, "keys"):
        kind = "text" if isinstance(ground_truth, str) else type(ground_truth).__name__
        return (f"it is {shown} ({kind}), where countdown's is {_SHAPE}; "
                "a plain answer like this is another task's ground truth (e.g. math's)")
    lacking = [k for k in ("target", "numbers") if k not in ground_truth]
    if lacking:
        return f"{shown} has no {' or '.join(map(repr, lacking))}; countdown's is {_SHAPE}"
    return f"{shown} is not {_SHAPE}: the target must be a number and the numbers a list of integers"


def unpack_truth(ground_truth: dict) -> tuple[Fraction, list[int]]:
    """Target and sorted numbers as plain Python values (parquet hands back numpy types)."""
    try:
        target = Fraction(ground_truth["target"].item() if hasattr(ground_truth["target"], "item")
                          else ground_truth["target"])
        numbers = sorted(operator.index(n) for n in ground_truth["numbers"])
    except (KeyError, TypeError, ValueError) as e:
        raise TinyRLError(f"countdown ground truth is malformed: {_what_is_wrong(ground_truth)}",
                          hint=f"each row needs reward_model.ground_truth = {_SHAPE}") from e
    return target, numbers


def compute_score(solution_str: str, ground_truth: dict, strict: bool = False,
                  format_score: float = 0.1, score: float = 1.0) -> float:
    """Score one completion (prompt + response when `strict`); see the module docstring."""
    target, numbers = unpack_truth(ground_truth)
    region = _strict_region(solution_str) if strict else solution_str
    answer = last_answer(region) if region is not None else None
    if answer is None:
        return 0.0
    expr = answer.strip()
    if len(expr) > MAX_EXPR_CHARS:  # checked before int() so huge digit runs cost nothing
        return format_score
    if sorted(int(n) for n in _NUMBER.findall(expr)) != numbers:
        return format_score
    value = evaluate_expression(expr)
    if value is None or abs(value - target) >= _TOLERANCE:
        return format_score
    return score
