"""A CPU run that shares its cores (issue 29 item 7): the detection rule on given numbers, the
doctor's row and the run's one notice. No timing is taken here: the figures are given."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tinyrl import contention
from tinyrl.contention import LOAD_MARGIN, SLOWDOWN, cpu_contention


def test_a_quiet_machine_says_nothing():
    assert cpu_contention(1.9, 2, 2, [4.0, 1.2, 1.1]) is None  # our own 2 threads make a load of ~2
    assert cpu_contention(2 + LOAD_MARGIN - 0.01, 2, 2) is None
    assert cpu_contention(0.3, 16, 8, [9.0, 30.0]) is None  # 3.3x the first step: within the rule


def test_load_above_the_cores_says_what_to_set():
    # doctor's report from the issue: 2 steps of 47.1 + 43.7 s passed with no hint on a loaded 2-core machine
    found = cpu_contention(9.0, 2, 2, [47.1, 43.7])
    assert found is not None and "load average 9.0 on 2 usable cores" in found.found
    assert "`OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE tinyrl train ...`" in found.fix and "22-32 s" in found.fix
    assert "countdown-tiny" not in found.fix  # a preset the user may not be running
    edge = cpu_contention(2 + LOAD_MARGIN, 2, 2)
    assert edge is not None and "load average 3.0" in edge.found


def test_a_step_far_slower_than_the_first_is_flagged_without_load():
    found = cpu_contention(0.5, 2, 2, [3.8, 4.0, 25.0])
    assert found is not None and "a step took 25.0 s, 7x the first step's 3.8 s" in found.found
    assert "OMP_NUM_THREADS=1" in found.fix
    assert cpu_contention(0.5, 2, 2, [3.8, SLOWDOWN * 3.8 - 0.1]) is None
    assert cpu_contention(0.5, 2, 2, [3.8, SLOWDOWN * 3.8]) is not None
    assert cpu_contention(0.5, 2, 2, [25.0]) is None  # one step: nothing to compare


def test_the_fix_follows_what_is_already_set():
    too_many = cpu_contention(0.5, 2, 8)  # more threads than cores on a quiet machine: one per core
    assert too_many is not None and "torch runs 8 threads on 2 usable cores" in too_many.found
    assert "OMP_NUM_THREADS=2 " in too_many.fix
    passive = cpu_contention(9.0, 2, 2, wait_policy="passive")
    assert "OMP_NUM_THREADS=1 in" in passive.fix and "OMP_WAIT_POLICY" not in passive.fix
    alone = cpu_contention(9.0, 2, 1)  # one thread already: nothing tinyrl can set
    assert alone is not None and "nothing to set" in alone.fix and "OMP_NUM_THREADS" not in alone.fix


def test_doctor_row_warns_with_the_fix(monkeypatch):
    from tinyrl.doctor.trial import cpu_load_row

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(contention, "usable_cpus", lambda: 2)
    monkeypatch.setattr(contention, "load_average", lambda: 9.0)
    row = cpu_load_row("cpu", [47.1, 43.7], "sft")
    assert row.status == "warn" and row.basis == "measured" and "OMP_NUM_THREADS=1" in row.fix
    assert "tinyrl sft ...`" in row.fix
    assert row.data["load_1min"] == 9.0 and row.data["step_s"] == [47.1, 43.7]
    monkeypatch.setattr(contention, "load_average", lambda: 1.2)
    assert cpu_load_row("cpu", [4.0, 3.7]).status == "pass"
    assert cpu_load_row("cuda", [4.0, 3.7]).status == "skipped"


def test_the_run_says_it_once(monkeypatch):
    from tinyrl.trainer import Trainer

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(contention, "usable_cpus", lambda: 2)
    load = {"now": 1.0}
    monkeypatch.setattr(contention, "load_average", lambda: load["now"])
    notes: list[str] = []
    run = SimpleNamespace(device=torch.device("cpu"), _notice=notes.append, _cpu_noticed=False,
                          cfg=SimpleNamespace(command="sft"))
    history = [{"timing/step": 4.0}]
    Trainer._check_cpu(run, history)
    assert notes == []  # quiet
    load["now"] = 6.0
    for step in range(5):
        history.append({"timing/step": 30.0})
        Trainer._check_cpu(run, history)
    assert len(notes) == 1 and "oversubscribed" in notes[0] and "OMP_NUM_THREADS=1" in notes[0]
    assert " tinyrl sft ...`" in notes[0]  # the command running (an SFT run was told `tinyrl train`)
    on_a_card = SimpleNamespace(device=torch.device("cuda"), _notice=notes.append, _cpu_noticed=False)
    Trainer._check_cpu(on_a_card, history)
    assert len(notes) == 1


def test_eval_on_a_shared_cpu_says_what_to_set_before_its_work(tmp_path, tiny_model_dir, monkeypatch, caplog):
    """eval on the CPU beside another job ran 40x slower with nothing said (the demo's eval: 5:45 for
    its first 10%, 0:08 for each 10% once the other job ended); train said it once per run."""
    import logging

    import pandas as pd

    from tinyrl.config import REPO_ROOT
    from tinyrl.eval import evaluate

    data = tmp_path / "test.parquet"
    pd.read_parquet(REPO_ROOT / "data" / "countdown" / "test.parquet")[:2].to_parquet(data)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(contention, "usable_cpus", lambda: 2)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)  # the fix names it: as a user's shell has it
    run = dict(task_name="countdown", n=0, engine="hf", max_new_tokens=2, progress=False, device="cpu")
    monkeypatch.setattr(contention, "load_average", lambda: 9.0)
    with caplog.at_level(logging.WARNING, logger="tinyrl.eval"):
        evaluate(str(tiny_model_dir), [str(data)], out_dir=tmp_path / "busy", **run)
    said = [r.getMessage() for r in caplog.records if r.name == "tinyrl.eval"]
    assert len(said) == 1 and "load average 9.0 on 2 usable cores" in said[0], said
    assert "`OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE tinyrl eval ...`" in said[0]
    caplog.clear()
    monkeypatch.setattr(contention, "load_average", lambda: 1.0)
    with caplog.at_level(logging.WARNING, logger="tinyrl.eval"):
        evaluate(str(tiny_model_dir), [str(data)], out_dir=tmp_path / "quiet", **run)
    assert not [r for r in caplog.records if r.name == "tinyrl.eval"]
    # on one thread there is nothing to set: not said (the suite runs so, on a loaded machine)
    monkeypatch.setattr(contention, "load_average", lambda: 9.0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    with caplog.at_level(logging.WARNING, logger="tinyrl.eval"):
        evaluate(str(tiny_model_dir), [str(data)], out_dir=tmp_path / "one-thread", **run)
    assert not [r for r in caplog.records if r.name == "tinyrl.eval"]
