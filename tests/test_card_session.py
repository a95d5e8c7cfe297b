"""benchmarks/card_session.py, issue 31's one device call: parts run in order inside one budget,
a part that overruns is killed with its children and keeps what it printed, and the parts after
it are not started. Real subprocesses; the gpu_check parts themselves are tested in test_gpu_check."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import card_session  # noqa: E402

sys.path.remove(str(ROOT / "benchmarks"))


def test_parts_run_in_order_until_the_budget_is_spent(tmp_path, monkeypatch):
    monkeypatch.setattr(card_session, "MIN_SECONDS", 1)
    pid_file = tmp_path / "grandchild.pid"
    parts = [("quick", [sys.executable, "-c", "print('versions here')"]),
             # prints a finding, then hangs in a grandchild (as pytest's workers would)
             ("hangs", ["sh", "-c", f"echo measured 1.5 GiB; sleep 60 & echo $! > {pid_file}; wait"]),
             ("later", [sys.executable, "-c", "print('never')"])]
    start = time.monotonic()
    summary = card_session.run_parts(parts, tmp_path / "out", seconds=4)
    assert time.monotonic() - start < 30
    assert summary[0].startswith("quick: exit 0,") and summary[1].startswith("hangs: cut off at the budget")
    assert summary[2].startswith("later: not started")
    out = tmp_path / "out"
    assert (out / "01-quick.txt").read_text() == "versions here\n"
    assert (out / "02-hangs.txt").read_text().startswith("measured 1.5 GiB")
    assert not (out / "03-later.txt").exists()
    assert (out / "summary.txt").read_text().splitlines() == summary
    pid = int(pid_file.read_text())
    for _ in range(50):  # killed with its group: gone, or a zombie where nothing reaps orphans
        if not alive(pid):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the cut-off part's child {pid} still runs")
    assert not card_session.all_ran_clean(summary)
    assert card_session.all_ran_clean(summary[:1] + summary[2:])


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_the_parts_see_the_checkout_and_the_pythonpath_they_were_given(tmp_path, monkeypatch):
    """GPU.md brings vLLM to the card on PYTHONPATH (/tmp/site): a part must still import it."""
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    code = "import os, tinyrl; print(os.environ['PYTHONPATH'], tinyrl.__file__)"
    card_session.run_parts([("path", [sys.executable, "-c", code])], tmp_path, 60)
    path, where = (tmp_path / "01-path.txt").read_text().split()
    assert path.split(os.pathsep) == [str(ROOT), "/tmp/site"] and where.startswith(str(ROOT))


def test_a_failing_part_fails_the_session(tmp_path):
    summary = card_session.run_parts([("fails", [sys.executable, "-c", "raise SystemExit(3)"])], tmp_path, 60)
    assert summary[0].startswith("fails: exit 3,") and not card_session.all_ran_clean(summary)


def test_every_gpu_check_part_is_a_config_the_check_accepts():
    """Each part's preset with its overrides (and those gpu_check adds on a card) passes the
    config's validation: a part refused at load would spend a lent card's minutes on nothing."""
    from tinyrl.config import load_config

    checks = [cmd for _, cmd in card_session.PARTS if card_session.CHECK in cmd]
    assert len(checks) == 5
    for cmd in checks:
        preset = cmd[cmd.index("--preset") + 1]
        sets = [cmd[i + 1] for i, word in enumerate(cmd) if word == "--set"]
        cfg = load_config(preset, ["trainer.device=cuda", "rollout.engine=hf", "model.name=/nonexistent",
                                   "trainer.max_steps=1", "trainer.test_every=0", "trainer.save_every=0", *sets])
        assert cfg.trainer.train_batch_size * cfg.rollout.n <= 64, cmd  # sized for minutes, not hours


def test_a_vllm_part_is_not_started_where_vllm_does_not_import(tmp_path, monkeypatch):
    """The lent card has no vLLM until GPU.md's bundle is brought: its part must not spend the budget."""
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    parts = [("check-vllm", [sys.executable, "-c", "print('ran')", "rollout.engine=vllm"]),
             ("after", [sys.executable, "-c", "print('ran')"])]
    summary = card_session.run_parts(parts, tmp_path, 60)
    assert summary[0].startswith("check-vllm: not started (vllm does not import")
    assert summary[1].startswith("after: exit 0,") and card_session.all_ran_clean(summary)
    assert not (tmp_path / "01-check-vllm.txt").exists()


def test_a_pytest_part_cut_off_at_the_budget_still_shows_why_its_failures_failed(tmp_path, monkeypatch):
    """The H200's pytest part (2026-11-28) was cut off at 96%: it named seven failures, and their
    tracebacks, printed only in pytest's final summary, never came."""
    monkeypatch.setattr(card_session, "MIN_SECONDS", 1)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_card.py").write_text("import time\n\n"
                                        "def test_a_fails():\n    assert 6 * 7 == 43, 'the reason it failed'\n\n"
                                        "def test_b_outlasts_the_budget():\n    time.sleep(120)\n")
    cmd = dict(card_session.PARTS)["pytest-fast"]
    cmd = [str(tests) if arg == "tests" else "1" if arg == "14" else arg for arg in cmd]
    summary = card_session.run_parts([("pytest-fast", cmd)], tmp_path / "out", seconds=40)
    assert summary[0].startswith("pytest-fast: cut off at the budget"), summary
    text = (tmp_path / "out" / "01-pytest-fast.txt").read_text()
    assert "test_a_fails failed (call)" in text and "the reason it failed" in text, text[-3000:]


def test_every_pytest_part_names_tests_that_exist():
    """A mistyped path would spend a lent card's minutes collecting nothing (pytest exits 4)."""
    named = [arg for _, cmd in card_session.PARTS if "pytest" in cmd for arg in cmd if arg.startswith("tests")]
    assert "tests/test_oom.py" in named
    for arg in named:
        assert (ROOT / arg).exists(), arg
