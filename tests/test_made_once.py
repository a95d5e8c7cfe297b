"""conftest.made_once: the demo tests' SFT runs are made once per test run, however many
pytest-xdist workers ask, and a half-made one (a worker failed) is made again."""

from __future__ import annotations

import multiprocessing
import os
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
