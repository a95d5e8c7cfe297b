"""Ctrl-C, SIGTERM and SIGHUP (a closed terminal) without losing work; a closed stdout (the
reader of a pipe gone) stops the same way (stdout_closed).

Before training starts (loading the model, the data): a signal raises `Interrupted`, the CLI
says so and exits 130 (SIGINT) or 143 (SIGTERM); there is nothing to save yet.
During training, the first signal asks the run to stop:
  - while the step has not yet changed any weights (sync, rollout, reward, no-grad forward
    passes, advantages) the step is abandoned at once (`StepAbandoned` is raised where the
    program is, e.g. inside a long rollout), the RNG state from the step's start is put back,
    and the run saves a checkpoint of the state before that step — the same bytes a save at the
    end of the previous step would have written, so a resumed run replays the step exactly;
  - once an update has begun, the step is finished, logged and saved.
Then the CLI says where it stopped and how to resume, and exits 130/143.
A second signal stops at once (os._exit): the last checkpoint on disk is intact (they are
written atomically) and --resume continues from it.
After the training loop (the run saved, the CLI printing its last lines, the interpreter
shutting down) the first signal is only said and the process ends as it was going to: raising
there showed a traceback from whatever ran then (torch's atexit hook, seen in CI) or said
"before training began" of a finished run. A second one stops at once, as during training.
A run nobody resumes (`tinyrl doctor`'s trial, in a temporary directory) trains inside
`throwaway()`: there a signal is taken as before training, wherever the step is.

The phases come from the run log's phase observers (RunLog.on_phase), so the trainer only
wraps its step in `stops.step(trainer)`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

from tinyrl.phases import Phase

# Phases before any weight changes: a signal there abandons the step. Any other phase
# (updates, and names this list does not know) finishes it: the safe default.
ABANDONABLE_PHASES = {str(p) for p in (Phase.SYNC, Phase.ROLLOUT, Phase.FORWARD, Phase.REWARD, Phase.ADVANTAGES)}
SIGNAL_NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM",
                signal.SIGHUP: "SIGHUP (the terminal closed)",
                signal.SIGPIPE: "a closed stdout (the reader of the pipe, e.g. `| head`, ended)"}


class Interrupted(BaseException):
    """A signal before the training loop: nothing to save. BaseException, like KeyboardInterrupt,
    so no `except Exception` on the way swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StepAbandoned(BaseException):
    """Raised inside a step that has not changed any weights yet."""


def exit_code(signum: int) -> int:
    return 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def _say(text: str) -> None:
    # os.write: safe inside a signal handler, and shown at once even under a live dashboard.
    try:
        os.write(2, ("\ntinyrl: " + text + "\n").encode())
    except OSError:
        pass


class StopSignals:
    def __init__(self) -> None:
        self.signum: int | None = None   # the first signal received
        self.training = False
        self.abandon_ok = False           # inside a step, before its first update
        self.abandoned = False
        self.step_no = 0                  # the step under way (1-based), for messages
        self.ended = False                # the training loop is over: a first signal is only said
        self._old: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self) -> "StopSignals":
        """Take over SIGINT/SIGTERM (main thread only: Python delivers signals there)."""
        if threading.current_thread() is threading.main_thread() and not self._old:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
            # A closed terminal or a dropped SSH session: it ended the run mid-step, unsaved, exit
            # 129 (until 2026-11-27). Under nohup SIGHUP is ignored, and stays so.
            if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
                self._old[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _handle(self, signum: int, frame) -> None:
        name = SIGNAL_NAMES.get(signum, f"signal {signum}")
        if self.signum is not None:
            # Only a training loop has checkpoints to speak of: before it (loading, or a command
            # that never trains: eval, doctor) "--resume continues from it" named nothing there.
            _say(f"{name} again: stopping at once, without saving. The last checkpoint on disk is "
                 "intact; --resume continues from it." if self.training or self.ended
                 else f"{name} again: stopping at once.")
            os._exit(exit_code(signum))
        self.signum = signum
        if self.ended:
            _say(f"{name}: the training loop had already ended; finishing on the way out. "
                 "Press Ctrl-C again to stop at once.")
            return
        if not self.training:
            raise Interrupted(signum)
        if self.abandon_ok:
            self.abandon_ok = False
            _say(f"{name}: abandoning step {self.step_no} (no weights changed yet) and saving a "
                 "checkpoint. Press Ctrl-C again to stop at once without saving.")
            raise StepAbandoned()
        _say(f"{name}: finishing step {self.step_no}, then saving a checkpoint. "
             "Press Ctrl-C again to stop at once without saving.")

    def request(self, signum: int) -> None:
        """A stop the program itself asks for (stdout_closed) in a training loop, taken as a first
        signal is, except that a step under way is finished, never abandoned: the request comes
        from inside a print. Outside a loop it asks nothing: the command goes on, its output
        discarded (raising there gave `tinyrl report | head -1` a traceback)."""
        if self.signum is not None or not self.training:
            return
        self.signum = signum
        _say(f"{SIGNAL_NAMES.get(signum, signum)}: finishing step {self.step_no}, then saving a checkpoint.")

    def _on_phase(self, phase: str) -> None:
        if phase not in ABANDONABLE_PHASES:
            self.abandon_ok = False

    @contextlib.contextmanager
    def step(self, trainer) -> Iterator[None]:
        """Run one training step; a signal before its updates abandons it (see the module doc)."""
        from tinyrl import checkpoint as ckpt

        if self._on_phase not in trainer.run.on_phase:
            trainer.run.on_phase.append(self._on_phase)
        rng = ckpt.rng_state()
        self.step_no = trainer.step + 1
        self.abandon_ok = self.training
        try:
            yield
        except StepAbandoned:
            ckpt.set_rng_state(rng)  # as if the step never began
            self.abandoned = True
        finally:
            self.abandon_ok = False


_ACTIVE: StopSignals | None = None


def install() -> StopSignals:
    """The process's handler (the CLI installs it first, so a Ctrl-C while loading is clean)."""
    global _ACTIVE
    if _ACTIVE is None:
        _ACTIVE = StopSignals()
    return _ACTIVE.install()


def active() -> StopSignals | None:
    return _ACTIVE


def stdout_closed() -> None:
    """stdout's reader has gone (`| head`, a pager quit): a write got EPIPE. Click's handler then
    ended the run with exit 1 and not a word, mid-step and unsaved (until 2026-11-27). Now fd 1
    goes to /dev/null, so later writes and the flush at exit succeed, and the run stops as on a
    signal: its step finished, a checkpoint saved, where and how to resume said on stderr, exit
    141 (128 + SIGPIPE, as the shell reports a process a closed pipe ended)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
    finally:
        os.close(devnull)
    if _ACTIVE is not None and not _THROWAWAY:
        _ACTIVE.request(signal.SIGPIPE)


def stop_on_closed_stdout(console):
    """A Rich `console` that, on a write to a pipe whose reader has gone, stops the run as a signal
    does (stdout_closed). Rich 15's own Console.on_broken_pipe raises SystemExit(1) there: the
    run ended mid-step, unsaved, with not a word on stderr."""
    console.on_broken_pipe = stdout_closed  # Rich calls self.on_broken_pipe(), no arguments
    return console


_THROWAWAY = False  # inside throwaway()


@contextlib.contextmanager
def throwaway() -> Iterator[None]:
    """Training loops whose run nobody resumes (`tinyrl doctor`'s trial, in a temporary directory
    removed on the way out) have no graceful stop: a signal in them is taken as before training
    (the CLI's handler raises Interrupted where the program is; without one, Python's own:
    KeyboardInterrupt, and SIGTERM ends the process), not as "finish the step, save a checkpoint"
    -- a large model's update can take minutes, for a checkpoint deleted with the directory, and
    the loop's end would have left the CLI's handler only saying a later signal."""
    global _THROWAWAY
    before, _THROWAWAY = _THROWAWAY, True
    try:
        yield
    finally:
        _THROWAWAY = before


@contextlib.contextmanager
def training() -> Iterator[StopSignals]:
    """The trainer's loop: signals ask for a clean stop. Uses the CLI's handler if there is one;
    otherwise (a library user) installs one for the loop only and restores the old handlers.
    Inside throwaway(): no clean stop, and the handler's state is left as it was."""
    if _THROWAWAY:
        yield _ACTIVE if _ACTIVE is not None else StopSignals()  # training stays False: a signal raises
        return
    stops = _ACTIVE if _ACTIVE is not None else StopSignals()
    own = not stops._old
    stops.install()
    stops.training, stops.ended = True, False
    try:
        yield stops
    finally:
        stops.training, stops.ended = False, True
        if own:
            stops.uninstall()


def end_of_run(trainer, run_dir, total: int, resume_cmd: str, started_at: int = 0) -> tuple[str, int]:
    """What the CLI says when train() returns, and the exit code: 0 when every step is on disk;
    130/143 after a signal (where it stopped, how to resume); 1 when steps were not checkpointed.
    `started_at`: the step the run (a resumed one) began at."""
    lost = trainer.run.unwritten()
    lost_text = ("; log lines not written (disk full): " + ", ".join(f"{n} in {k}" for k, n in lost.items())
                 if lost else "")
    missing = trainer.run.missing_text()  # which steps' metrics records are lost, by step
    lost_text += f"; {missing}" if missing else ""
    unsaved = trainer.saves.unsaved(trainer.step)
    if trainer.stopped_by is not None:
        name = SIGNAL_NAMES.get(trainer.stopped_by, str(trainer.stopped_by))
        saved = trainer.saves.last_saved
        where = (f"checkpoint of step {saved} in {run_dir / 'checkpoints'}" if saved is not None
                 else "no checkpoint (it could not be written)")
        stops = active()
        abandoned = f" (step {trainer.step + 1} was abandoned before its updates)" \
            if stops is not None and stops.abandoned else ""
        return (f"stopped by {name} at step {trainer.step} of {total}{abandoned}; {where}"
                + (f"; {unsaved}" if unsaved else "") + lost_text
                + f"\nresume with: {resume_cmd}", exit_code(trainer.stopped_by))
    if unsaved:
        return f"the run reached step {trainer.step}, but {unsaved}{lost_text}", 1
    return (f"run finished at step {trainer.step}{_why_nothing_trained(trainer.step, total, started_at)}: "
            f"{run_dir}{lost_text}  (plots: tinyrl report {run_dir})", 0)


def unsaved_hint(last_error: str, resume_cmd: str) -> str:
    """What to do about steps not checkpointed: free disk space only when the disk was the cause
    (a refused write, "Operation not permitted", was told to free space as well)."""
    full = "disk" in last_error or "space" in last_error.lower()
    fix = "free disk space" if full else "fix what the last error says (the run directory's permissions, a disk gone)"
    return f"{fix}, then redo those steps with: {resume_cmd}"


def _why_nothing_trained(step: int, total: int, started_at: int) -> str:
    """`--resume` of a run already at its end trains nothing, and should say why: the end is
    behind it (`--max-steps 3` at step 6), or it is the end (a finished run resumed as it was,
    which said only "run finished at step 60", as if it had trained)."""
    if step > total:
        return f" (it was there already: the end, step {total}, is behind it; nothing was trained)"
    if step == started_at:
        return (f" (it was there already: step {total} is its end; nothing was trained. To train further: "
                f"--resume --max-steps N, N past {total})")
    return ""
