"""pass@k, maj@k and mean@n against hand-worked numbers."""

import pytest

from tinyrl.eval_metrics import maj_at_k, pass_at_k, summarize


def test_pass_at_k_hand_worked():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)               # 1 - C(3,1)/C(4,1) = 1 - 3/4
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)                # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)                # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)      # C(7,5)=21, C(10,5)=252
    assert pass_at_k(4, 3, 2) == 1.0                               # n - c < k: every draw has one
    assert pass_at_k(4, 4, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_maj_at_k_hand_worked():
    answers, ok = ["3", "5", "5", None, "3"], [False, True, True, False, False]
    assert maj_at_k(answers, ok, 1) is False      # "3"
    assert maj_at_k(answers, ok, 3) is True       # "5" twice
    assert maj_at_k(answers, ok, 5) is False      # "3" and "5" tie at 2: the first seen, "3", wins
    assert maj_at_k([None, None], [False, False], 2) is False
    assert maj_at_k(["1/2", " 1/2"], [True, True], 2) is True  # spacing does not split a vote


def test_summarize_averages_over_problems():
    probs = [(["1", "1", "2", "2"], [True, True, False, False]),   # c=2
             (["x", None, "y", "y"], [False, False, False, False])]  # c=0
    m = summarize(probs, [1, 2, 8])
    assert m["mean@4"] == pytest.approx(0.25)
    assert m["pass@1"] == pytest.approx((0.5 + 0) / 2)
    assert m["pass@2"] == pytest.approx((1 - 1 / 6 + 0) / 2)        # 1 - C(2,2)/C(4,2)
    assert m["maj@2"] == pytest.approx(0.5)
    assert "pass@8" not in m                                      # k > n is not estimable
