"""conftest.made_once: the demo tests' SFT runs are made once per test run, however many
pytest-xdist workers ask, and a half-made one (a worker failed) is made again; and the tests
that share them run on one worker (conftest.COUNTDOWN_DEMO_SFT), where the installed pytest and
pytest-xdist group at all."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import made_once


class _Factory:  # the part of pytest's TempPathFactory made_once reads
    def __init__(self, base: Path):
        self.base = base

    def getbasetemp(self) -> Path:
        return self.base


def _ask(worker: str, base: str, log: str) -> None:
    """One "worker": asks for the home; its make appends a line to log (slowly, so the other waits)."""
    os.environ["PYTEST_XDIST_WORKER"] = worker

    def make(home: Path) -> None:
        with open(log, "a") as f:
            f.write(worker + "\n")
        import time
        time.sleep(0.5)
        home.mkdir(parents=True)
        (home / "made-by").write_text(worker)

    home = made_once(_Factory(Path(base) / worker), "shared", make)
    assert (home / "made-by").exists()


def test_two_workers_at_once_make_it_once(tmp_path):
    log = tmp_path / "log"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_ask, args=(w, str(tmp_path), str(log))) for w in ("gw0", "gw1")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(log.read_text().split()) == 1        # one make, the other worker waited and reused it
    assert (tmp_path / "shared" / "DONE").exists()  # in the workers' common root, not a worker's own


def test_a_half_made_home_is_made_again(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "left-over").write_text("a worker failed here")  # no DONE
    made = []
    home = made_once(_Factory(tmp_path), "shared", lambda h: (made.append(h), h.mkdir()))
    assert made == [home] and not (home / "left-over").exists()
    assert made_once(_Factory(tmp_path), "shared", lambda h: made.append(h)) == home and len(made) == 1


def test_loadgroup_runs_a_group_on_one_worker(tmp_path):
    """README's test command (`-n 2 --dist loadgroup`) with the installed pytest and pytest-xdist
    on a suite of 6 grouped and 6 ungrouped tests: the grouped ones all run on one worker. With
    pytest 9.2 and xdist 3.8 they were dealt to both (xdist issue #1386), and the demo tests
    waited on each other's SFT runs (pyproject.toml pins pytest below 9.2 for it)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(
        "import pytest\n"
        "@pytest.mark.xdist_group('shared')\n@pytest.mark.parametrize('i', range(6))\ndef test_grouped(i): pass\n"
        "@pytest.mark.parametrize('i', range(6))\ndef test_alone(i): pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] .*PASSED \S*::(test_\w+)\[", done.stdout)
    assert sorted(test for _, test in ran) == ["test_alone"] * 6 + ["test_grouped"] * 6, done.stdout
    assert len({worker for worker, test in ran if test == "test_grouped"}) == 1, done.stdout
