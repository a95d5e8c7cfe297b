"""tinyrl.interrupts with real signals delivered to this process: what a first and a second
SIGINT do before, during and after the training loop. (The whole CLI under signals at random
moments: tests/test_faults.py.)"""

from __future__ import annotations

import signal
import threading

import pytest

from tinyrl import interrupts


class _Exited(BaseException):
    pass


@pytest.fixture
def stops(monkeypatch):
    """A fresh process handler (as the CLI installs it), taken away again after the test; os._exit
    raises _Exited(code) instead of ending the test process."""
    assert threading.current_thread() is threading.main_thread()  # Python delivers signals there only
    fresh = interrupts.StopSignals()
    monkeypatch.setattr(interrupts, "_ACTIVE", fresh)

    def fake_exit(code):
        raise _Exited(code)
    monkeypatch.setattr(interrupts.os, "_exit", fake_exit)
    fresh.install()
    try:
        yield fresh
    finally:
        fresh.uninstall()


def test_a_signal_before_training_raises_interrupted(stops):
    with pytest.raises(interrupts.Interrupted) as got:
        signal.raise_signal(signal.SIGINT)
    assert got.value.signum == signal.SIGINT


def test_a_second_signal_before_training_stops_at_once_without_naming_a_checkpoint(stops, capfd):
    """Loading a model, or eval/doctor, which never train: the first signal raised Interrupted;
    one more while that unwinds (a slow cleanup) said "--resume continues from it" of a run that
    had no checkpoint, or of a command that makes none."""
    with pytest.raises(interrupts.Interrupted):
        signal.raise_signal(signal.SIGINT)
    with pytest.raises(_Exited) as got:
        signal.raise_signal(signal.SIGINT)
    assert got.value.args == (130,)
    err = capfd.readouterr().err
    assert "again: stopping at once." in err and "resume" not in err and "checkpoint" not in err


def test_a_first_signal_in_training_asks_to_stop_and_a_second_stops_at_once(stops, capfd):
    with interrupts.training() as s:
        signal.raise_signal(signal.SIGINT)  # outside a step: the step in hand is finished
        assert s.requested and s.signum == signal.SIGINT
        with pytest.raises(_Exited) as got:
            signal.raise_signal(signal.SIGINT)
        assert got.value.args == (130,)
    err = capfd.readouterr().err
    assert "finishing step" in err and "again: stopping at once, without saving. The last checkpoint" in err


def test_after_the_loop_a_first_signal_is_only_said_and_a_second_stops_at_once(stops, capfd):
    # The run has ended and saved; the CLI prints its last lines and the interpreter shuts down
    # (atexit hooks: torch's dump_compile_times, where CI saw a traceback of Interrupted).
    with interrupts.training():
        pass
    signal.raise_signal(signal.SIGINT)  # no exception: the process ends as it was going to
    assert "training loop had already ended" in capfd.readouterr().err
    with pytest.raises(_Exited) as got:
        signal.raise_signal(signal.SIGTERM)
    assert got.value.args == (143,)


def test_the_next_loop_in_the_same_process_stops_cleanly_again(stops):
    with interrupts.training():
        pass
    with interrupts.training() as s:
        signal.raise_signal(signal.SIGINT)
        assert s.requested and not s.ended


def test_a_throwaway_loop_has_no_graceful_stop_and_leaves_the_handler_as_it_was(stops):
    """`tinyrl doctor`'s trial: a signal in its loop stops at once (Interrupted, as before training)
    instead of finishing the step and saving a checkpoint into a directory deleted right after; and
    its end does not leave a later signal only said (the doctor goes on after its trial)."""
    with interrupts.throwaway():
        with interrupts.training() as s:
            assert s is stops and not s.training
            with pytest.raises(interrupts.Interrupted) as got:
                signal.raise_signal(signal.SIGTERM)
            assert got.value.signum == signal.SIGTERM
    assert not stops.training and not stops.ended  # a later signal is raised, not only said
    stops.signum = None  # as if that signal had not come (a second one stops at once)
    with interrupts.training() as s:  # outside throwaway(): the graceful stop, as ever
        signal.raise_signal(signal.SIGINT)
        assert s.requested and s.training

def test_a_resumed_run_already_at_its_end_says_nothing_was_trained():
    """`tinyrl train --preset countdown-demo --resume` of the finished demo said only "run finished
    at step 60", as if it had trained; a run that did train says what it always said."""
    from types import SimpleNamespace

    def ended(step: int, total: int, started_at: int) -> str:
        trainer = SimpleNamespace(step=step, stopped_by=None, run=SimpleNamespace(unwritten=dict, missing_text=str),
                                  saves=SimpleNamespace(unsaved=lambda step: ""))
        message, code = interrupts.end_of_run(trainer, "runs/d", total, "tinyrl train ...", started_at)
        assert code == 0
        return message

    assert "nothing was trained. To train further: --resume --max-steps N, N past 60" in ended(60, 60, 60)
    assert ended(60, 60, 30).startswith("run finished at step 60: runs/d")
    assert ended(60, 60, 0).startswith("run finished at step 60: runs/d")
    assert "the end, step 40, is behind it; nothing was trained" in ended(60, 40, 60)


def test_ctrl_c_while_train_reads_its_config_and_data_is_one_line_and_writes_nothing(tmp_path, countdown_train):
    """A Ctrl-C while the config and the data were read (seconds on a large parquet), before the
    handler's catch began, printed a traceback; now one line, exit 130, no run directory."""
    from helpers.busy_child import interrupt_when_busy

    run = tmp_path / "run"
    done = interrupt_when_busy("tinyrl.setup:check_data_rows", 1,
                               ["train", "--preset", "countdown-tiny", "--out", str(run), "--no-dashboard",
                                "--set", f"data.train_path={countdown_train(256)}"], tmp_path / "busy")
    assert done.returncode == 130, done.stderr[-3000:]
    assert done.stderr.strip() == ("stopped by SIGINT (Ctrl-C) while reading the config and the data; "
                                   "nothing was written")
    assert not run.exists()


def test_under_nohup_sighup_stays_ignored_and_otherwise_it_stops_a_run_like_sigterm(monkeypatch):
    """SIGHUP (a closed terminal) is taken as SIGINT/SIGTERM are, except where it is ignored
    (nohup): that choice of the user's is kept."""
    before = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        fresh = interrupts.StopSignals().install()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        fresh.uninstall()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        fresh = interrupts.StopSignals().install()
        monkeypatch.setattr(interrupts, "_ACTIVE", fresh)
        with pytest.raises(interrupts.Interrupted) as got:
            signal.raise_signal(signal.SIGHUP)
        assert got.value.signum == signal.SIGHUP and interrupts.exit_code(signal.SIGHUP) == 129
        fresh.uninstall()
    finally:
        signal.signal(signal.SIGHUP, before)


def test_steps_left_unsaved_are_told_to_free_space_only_when_the_disk_was_the_cause():
    resume = "tinyrl train --out runs/r --resume"
    full = interrupts.unsaved_hint("not enough disk for the step-3 checkpoint: it needs 5.0 MiB", resume)
    enospc = interrupts.unsaved_hint("could not write the step-3 checkpoint ([Errno 28] No space left on device)", resume)
    eperm = interrupts.unsaved_hint("could not write the step-3 checkpoint ([Errno 1] Operation not permitted)", resume)
    assert full.startswith("free disk space, then redo") and enospc.startswith("free disk space")
    assert "free disk space" not in eperm and eperm.startswith("fix what the last error says") and resume in eperm
