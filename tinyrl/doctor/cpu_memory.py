"""The doctor's CPU memory rows, like for like.

Measured: the trainer's own live tensor bytes at each phase's peak, counted during the trial by
the tracker the memory simulation itself uses (tinyrl.memory.simulate.RegionTracker, torch's
MemTracker: every tensor storage alive, the models' weights included), here on the real tensors.
Planned: the simulation (tinyrl.memory.simulate.simulate_phase) of the SAME step: same model,
dtype, LoRA, checkpointing and log-prob chunk, at the micro-batch and padded length the trainer
really ran in that phase (read from its BudgetKeeper), less the CUDA allocator's headroom
(the CPU has no caching allocator). Neither side counts allocator caches, code or Python
objects: that is what the process's RSS adds, and why RSS growth is not compared.
The rollout phase is not simulated (the plan prices it by formula for vLLM or HF generate in
bf16): its measured peak is shown beside the trainer's resident tensors, without a ratio.
"""

from __future__ import annotations

import contextlib
from typing import Any

from tinyrl.checkpoint import human_bytes
from tinyrl.doctor.report import Row, skipped
from tinyrl.phases import BUDGETED_PHASES, PLANNED_PHASES, Phase

MEASURED_AS = "live tensor bytes (MemTracker)"
# Same tracker, same shapes: the two differ by what the trace cannot see (kernel temporaries of
# the real CPU ops vs the fake ones) -- beyond 15% either way the plan is wrong for this step.
TOLERANCE = 0.15


def _totals_tracker():
    """RegionTracker counting totals only: its per-module hooks (which sort bytes into weights,
    activations ... for the simulation's report, and reset when a top-level module runs again)
    would fail on a real run's interleaved forwards and backwards, and keep a snapshot per module
    call. The storages it counts -- every one created under it, plus track_external's -- are the
    same, so the total stays the simulation's quantity."""
    from tinyrl.memory.simulate import RegionTracker

    class TotalsTracker(RegionTracker):
        def _pre_fw_hook(self, module, inputs) -> None:
            pass

        def _post_fw_hook(self, module, inputs, outputs) -> None:
            pass

        def _pre_bw_hook(self, module, args) -> None:
            pass

        def _post_bw_hook(self, module, args) -> None:
            pass

    return TotalsTracker()


class TensorPeaks:
    """Per-phase peak of live tensor bytes while the trainer runs (CPU only: on CUDA the
    allocator keeps its own peaks, tinyrl.runlog). Use: attach(trainer), then run the trainer
    inside `with peaks:`; RunLog's phase observer moves it from phase to phase."""

    def __init__(self) -> None:
        self.tracker = _totals_tracker()
        self.peaks: dict[str, int] = {}                   # phase -> largest peak over its runs
        self.shapes: dict[str, tuple[int, int]] = {}      # phase -> (micro-batch rows, seq_len), largest
        self._external: list[Any] = []
        self._inside = False

    def attach(self, trainer) -> None:
        keeper = trainer.budgets
        real = keeper.run_accumulating

        def recorded(phase, n_rows, seq_len, *args, **kwargs):  # the micro-batch this call will use
            rows = min(n_rows, max(1, keeper.budgets[phase] // max(1, seq_len)))
            old = self.shapes.get(str(phase), (0, 0))
            if rows * seq_len > old[0] * old[1]:
                self.shapes[str(phase)] = (rows, seq_len)
            return real(phase, n_rows, seq_len, *args, **kwargs)

        keeper.run_accumulating = recorded
        m = trainer.models
        self._external = [x for x in (m.actor, m.critic_backbone, m.reference, m.value_head) if x is not None]
        self._external += [learner.opt for learner in trainer.learners.values()]
        trainer.run.on_phase.append(self.phase)

    def __enter__(self) -> "TensorPeaks":
        self.tracker.__enter__()
        self._inside = True
        # weights (and optimizer state, if any) made before the trial are alive in every phase
        self.tracker.track_external(*self._external)
        return self

    def __exit__(self, *exc) -> None:
        self.phase("")  # closes the last phase
        self._inside = False
        self.tracker.__exit__(*exc)

    def phase(self, name: str) -> None:
        if not self._inside:
            return
        ended = self.tracker._region
        self.tracker.mark(name)
        if ended:
            total = self.tracker.regions[ended]["total"]
            self.peaks[ended] = max(self.peaks.get(ended, 0), total)


def planned_step_bytes(cfg, dtype: str, phase: str, rows: int, seq_len: int, response_len: int) -> int:
    """The simulation of the step the trainer ran: tensor bytes at the phase's peak."""
    from tinyrl.memory import simulate as sim
    from tinyrl.memory.from_config import load_spec, role_flags

    m = cfg.model
    parts = sim.simulate_phase(load_spec(m.name), phase, rows, seq_len,
                               response_len=max(1, min(response_len, seq_len - 1)), finetune=m.finetune,
                               lora_rank=m.lora_rank, lora_targets=tuple(m.lora_targets),
                               gradient_checkpointing=m.gradient_checkpointing, dtype=dtype,
                               logprob_chunk=m.logprob_chunk, with_entropy=True, **role_flags(cfg))
    return parts["peak"] - parts["allocator"]  # the allocator's headroom is the CUDA cache's


def cpu_memory_rows(cfg, peaks: TensorPeaks, dtype: str, response_len: int) -> list[Row]:
    rows = []
    from tinyrl.config import has_critic

    budgeted = {str(p) for p in BUDGETED_PHASES}
    for phase in map(str, PLANNED_PHASES):
        if phase == Phase.CRITIC_UPDATE and not has_critic(cfg):
            continue  # no critic in this algorithm (tinyrl.roles): no row, as the plan has no phase
        got = peaks.peaks.get(phase)
        name = f"memory: {phase}"
        if got is None:
            rows.append(skipped(name, "the phase did not run"))
            continue
        data: dict[str, Any] = {"measured_bytes": got, "measured_as": MEASURED_AS, "dtype": dtype}
        if phase not in budgeted:
            rows.append(Row(name, "pass", f"measured {human_bytes(got)} of live tensors at the phase's peak (the weights, and "
                            "what the trainer's thread made: an engine's own workers are not counted); not "
                            "simulated on CPU (the plan prices rollout by formula), so no ratio",
                            basis="measured", data=data))
            continue
        shape = peaks.shapes.get(phase)
        if shape is None:
            rows.append(skipped(name, "the trainer ran no micro-batch in this phase", **data))
            continue
        planned = planned_step_bytes(cfg, dtype, phase, shape[0], shape[1], response_len)
        ratio = got / planned
        data.update(planned_bytes=planned, ratio=ratio, micro_batch=shape[0], seq_len=shape[1],
                    response_len=response_len, plan_source="simulated: the same step (shapes as run)")
        found = (f"measured {human_bytes(got)} / planned {human_bytes(planned)} = {ratio:.2f}x: live tensor bytes, "
                 f"both sides, {shape[0]} x {shape[1]} tokens per micro-batch in {dtype}")
        if abs(ratio - 1) > TOLERANCE:
            rows.append(Row(name, "warn", found + ": the simulation misses this step's tensors by more than "
                            f"{TOLERANCE:.0%}", basis="simulated vs measured", data=data,
                            fix="the memory plan is built from this simulation: attach this report "
                                "(tinyrl doctor --json --out FILE) to an issue"))
        else:
            rows.append(Row(name, "pass", found, basis="simulated vs measured", data=data))
    return rows


@contextlib.contextmanager
def measuring(peaks: TensorPeaks | None):
    """`with measuring(peaks):` -- the tracker when there is one (CPU), nothing otherwise."""
    if peaks is None:
        yield
    else:
        with peaks:
            yield
