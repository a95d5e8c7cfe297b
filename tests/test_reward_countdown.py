"""Countdown reward: TinyZero's scores, strict-mode extraction, and safety on hostile strings."""

from __future__ import annotations

import re
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyrl.errors import TinyRLError
from tinyrl.rewards.countdown import compute_score, evaluate_expression, last_answer

GT = {"target": 24, "numbers": [2, 3, 4]}
PROMPT = "A conversation ...\nUser: Using the numbers [2, 3, 4] ...\nAssistant: Let me solve this step by step.\n<think>"


def ans(expr: str) -> str:
    return f"<think>thinking</think> <answer>{expr}</answer>"


CASES = [
    ("correct", ans("2 * 3 * 4"), 1.0),
    ("correct, parentheses and order", ans("(4 * 3) * 2"), 1.0),
    ("wrong value", ans("2 + 3 + 4"), 0.1),
    ("reuses a number", ans("3 * 4 * 2 * 2"), 0.1),
    ("misses a number", ans("6 * 4"), 0.1),
    ("extra number", ans("2 * 3 * 4 * 1"), 0.1),
    ("no tags", "2 * 3 * 4", 0.0),
    ("unclosed tag", "<answer>2 * 3 * 4", 0.0),
    ("empty answer", ans(""), 0.1),
    ("prose in answer", ans("2 times 3 times 4"), 0.1),
    ("equation with =", ans("2 * 3 * 4 = 24"), 0.1),
    ("last answer wins (correct last)", ans("2 + 3 + 4") + ans("2 * 3 * 4"), 1.0),
    ("last answer wins (wrong last)", ans("2 * 3 * 4") + ans("2 + 3 + 4"), 0.1),
    ("answer followed by a newline", ans("2 * 3 * 4") + "\n", 1.0),
    ("multi-line answer", ans("2 *\n 3 * 4"), 1.0),
    ("unary minus counts the literal", ans("-(-(2 * 3 * 4))"), 1.0),
    ("deep unary chain", ans("-" * 400 + "(2 * 3 * 4)"), 1.0),
    ("division by zero", ans("2 * 3 * 4 / (4 - 4)"), 0.1),
    ("power", ans("2 ** 3 * 3"), 0.1),
    ("floor division", ans("(4 // 2) * 3 * 4"), 0.1),
    ("float literal", ans("2.0 * 3 * 4"), 0.1),
    ("exponent float", ans("1e999"), 0.1),
    ("unicode digits", ans("٢ * ٣ * ٤"), 0.1),
    ("fullwidth digits", ans("２ * ３ * ４"), 0.1),
    ("NUL byte", ans("2 * 3 * 4\x00"), 0.1),
    ("name lookup", ans("__import__('os')"), 0.1),
]


@pytest.mark.parametrize("completion,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_score_table(completion, expected):
    assert compute_score(completion, GT) == expected


def test_tolerance_is_tinyzero_1e5():
    assert compute_score(ans("1000000 / 999999"), {"target": 1, "numbers": [1000000, 999999]}) == 1.0
    assert compute_score(ans("100000 / 99999"), {"target": 1, "numbers": [100000, 99999]}) == 0.1


def test_fraction_intermediates_and_digit_separators():
    assert compute_score(ans("6 / (1 - 3 / 4)"), {"target": 24, "numbers": [1, 3, 4, 6]}) == 1.0
    # Python reads 1_2 as 12; the numbers check sees 1 and 2. The whitelist refuses "_".
    assert compute_score(ans("1_2"), {"target": 12, "numbers": [1, 2]}) == 0.1


def test_custom_scores_and_numpy_ground_truth():
    gt = {"target": np.int64(24), "numbers": np.array([4, 3, 2])}
    assert compute_score(ans("2 * 3 * 4"), gt, format_score=0.0, score=2.0) == 2.0
    assert compute_score(ans("2 + 3 + 4"), gt, format_score=0.0, score=2.0) == 0.0
    gt_list = {"target": 24, "numbers": [np.int32(2), np.int64(3), 4]}
    assert compute_score(ans("2 * 3 * 4"), gt_list) == 1.0


def test_malformed_ground_truth_is_a_user_error():
    shape = '{"target": int, "numbers": [int, ...]}'
    # what is wrong, in the file's terms: Python's own words ("KeyError: 'target'") were said
    with pytest.raises(TinyRLError, match="ground truth") as err:
        compute_score(ans("1"), {"numbers": [1]})
    assert err.value.message.endswith(f"{{'numbers': [1]}} has no 'target'; countdown's is {shape}"), err.value.message
    with pytest.raises(TinyRLError, match="ground truth") as err:
        compute_score(ans("1"), {"target": 1, "numbers": [1.5]})
    assert "the numbers a list of integers" in err.value.message and "Error" not in err.value.message
    with pytest.raises(TinyRLError) as err:  # a maths row's answer
        compute_score(ans("1"), "42")
    assert err.value.message == (f"countdown ground truth is malformed: it is '42' (text), where countdown's is {shape}; "
                                 "a plain answer like this is another task's ground truth (e.g. math's)")


def test_strict_keeps_tinyzero_last_line_trap():
    good = PROMPT + " so 2*3*4.</think>\n" + "<answer>2 * 3 * 4</answer>"
    assert compute_score(good, GT, strict=True) == 1.0
    # The known trap: a newline after the answer leaves an empty last line -> 0, not 1.
    assert compute_score(good + "\n", GT, strict=True) == 0.0
    assert compute_score(good + "\n", GT) == 1.0
    # Answer on an earlier line than the last: strict sees nothing.
    assert compute_score(good + "\nthat is all", GT, strict=True) == 0.0


def test_strict_cuts_at_the_first_assistant_marker():
    assert compute_score("<answer>2 * 3 * 4</answer>", GT, strict=True) == 0.0  # no marker
    # An answer in the prompt before "Assistant:" is cut away with it.
    assert compute_score("<answer>2*3*4</answer>\nAssistant: no idea", GT, strict=True) == 0.0
    qwen = "<|im_start|>user\n Using ...<|im_end|>\n<|im_start|>assistant\nok\n<answer>4*3*2</answer>"
    assert compute_score(qwen, GT, strict=True) == 1.0


@pytest.mark.parametrize("completion,expected", [
    (ans("9**9**9**9"), 0.1),
    (ans("(" * 100_000 + "2*3*4" + ")" * 100_000), 0.1),
    (ans("(" * 150 + "2*3*4" + ")" * 150), 1.0),  # under the size bound: still evaluated
    (ans("9" * 1_000_000), 0.1),
    (ans("1+" * 300_000 + "1"), 0.1),
    ("<answer>" * 200_000, 0.0),  # quadratic for re.finditer; linear here
    ("x" * 1_000_000 + ans("2*3*4"), 1.0),
    ("\x00" * 1_000_000, 0.0),
], ids=["power tower", "100k parentheses", "150 parentheses", "1M digits", "long sum",
        "unclosed tags", "1MB before answer", "1MB of NUL"])
def test_hostile_inputs_return(completion, expected):
    assert compute_score(completion, GT) == expected


def test_evaluate_expression_is_exact():
    assert evaluate_expression("1 / 3 * 3") == 1
    assert evaluate_expression("(1 + 2) / 4") == pytest.approx(0.75)
    assert evaluate_expression("2 ** 3") is None
    assert evaluate_expression("1 / (2 - 2)") is None


FUZZ = settings(max_examples=200, deadline=timedelta(seconds=2))
ARITH = st.text(alphabet="0123456789+-*/(). \n", max_size=80)


@FUZZ
@given(st.text(max_size=300), st.booleans())
def test_fuzz_arbitrary_text(text, strict):
    assert compute_score(text, GT, strict=strict) in {0.0, 0.1, 1.0}


@FUZZ
@given(st.one_of(st.text(max_size=200), ARITH), st.booleans())
def test_fuzz_text_in_answer_tags(text, strict):
    result = compute_score("Assistant: " + ans(text), GT, strict=strict, format_score=0.25, score=3.0)
    assert result in {0.0, 0.25, 3.0}
    if not strict:  # an opening tag with a closing one after it always makes a match
        assert result != 0.0


@FUZZ
@given(st.lists(st.sampled_from(["<answer>", "</answer>", "a", "\n", "<", ">"]), max_size=40).map("".join))
def test_last_answer_matches_tinyzero_regex(text):
    matches = list(re.finditer(r"<answer>(.*?)</answer>", text, re.DOTALL))
    assert last_answer(text) == (matches[-1].group(1) if matches else None)
