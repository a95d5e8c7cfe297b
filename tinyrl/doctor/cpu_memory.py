"""The doctor's CPU memory rows, like for like.

Measured: the trainer's own live tensor bytes at each phase's peak, counted during the trial by
the tracker the memory simulation itself uses (tinyrl.memory.simulate.RegionTracker, torch's
MemTracker: every tensor storage alive, the models' weights included), here on the real tensors.
Planned: the simulation (tinyrl.memory.simulate.simulate_phase) of the SAME step: same model,
dtype, LoRA, checkpointing and log-prob chunk, packed as the trainer packs (padded with
model.padding_free=false), for each micro-batch
the trainer really formed in that phase (its BudgetKeeper's slices, each row's real prompt and
response tokens, the rows that shared a prompt, the padded width), the largest of them, less the CUDA allocator's headroom
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
from tinyrl.phases import BUDGETED_PHASES, Phase

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
        # phase -> the micro-batches it ran: ((prompt, response) real tokens per row, width, response
        # width, each row's shared-prompt number or None: Step.groups)
        self.batches: dict[str, set[tuple]] = {}
        self._external: list[Any] = []
        self._inside = False

    def attach(self, trainer) -> None:
        keeper, m = trainer.budgets, trainer.models
        real, row_tokens = keeper.run_accumulating, m.row_tokens
        last: dict[str, Any] = {}

        def lengths(batch):  # called on the batch just before run_accumulating (trainer, learners)
            P = batch.input_ids.shape[1] - batch.response_len
            mask = batch.attention_mask
            last["rows"] = list(zip(mask[:, :P].sum(-1).tolist(), mask[:, P:].sum(-1).tolist()))
            last["width"] = (batch.input_ids.shape[1], batch.response_len)
            return row_tokens(batch)

        def recorded(phase, n_rows, seq_len, attempt, row_tokens=None, groups=None):  # the micro-batches this call forms
            rows = last.pop("rows", None)  # its batch's, recorded just before (never an earlier batch's)
            for s in keeper.slices(phase, n_rows, seq_len, row_tokens, groups):
                if rows is not None and len(rows) == n_rows:
                    shared = tuple(groups[s]) if groups is not None else None
                    self.batches.setdefault(str(phase), set()).add((tuple(rows[s]), *last["width"], shared))
            return real(phase, n_rows, seq_len, attempt, row_tokens, groups)

        keeper.run_accumulating = recorded
        m.row_tokens = lengths
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


def planned_step_bytes(cfg, dtype: str, phase: str, rows: tuple[tuple[int, int], ...], seq_len: int,
                       response_len: int, groups: tuple[int, ...] | None = None) -> int:
    """The simulation of a micro-batch the trainer ran (each row's real (prompt, response)
    tokens in a [len(rows), seq_len] batch; `groups`: the rows that shared a prompt, which the
    packed pass computed once): tensor bytes at the phase's peak."""
    from tinyrl.memory import simulate as sim
    from tinyrl.memory.from_config import load_spec, step_flags

    m = cfg.model
    parts = sim.simulate_phase(load_spec(m.name), phase, len(rows), seq_len, response_len=response_len,
                               finetune=m.finetune, lora_rank=m.lora_rank, lora_targets=tuple(m.lora_targets),
                               gradient_checkpointing=m.gradient_checkpointing, dtype=dtype,
                               logprob_chunk=m.logprob_chunk, rows=rows, groups=groups, **step_flags(cfg))
    return parts["peak"] - parts["allocator"]  # the allocator's headroom is the CUDA cache's


def cpu_memory_rows(cfg, peaks: TensorPeaks, dtype: str) -> list[Row]:
    rows = []
    from tinyrl.memory.from_config import planned_phases

    budgeted = {str(p) for p in BUDGETED_PHASES}
    for phase in planned_phases(cfg):  # no critic, or an SFT step: no row, as the plan has no phase
        got = peaks.peaks.get(phase)
        name = f"memory: {phase}"
        if got is None:
            why = ("the SFT trial runs no validation (this phase is its validation loss)"
                   if cfg.command == "sft" and phase == Phase.FORWARD else "the phase did not run")
            rows.append(skipped(name, why))
            continue
        data: dict[str, Any] = {"measured_bytes": got, "measured_as": MEASURED_AS, "dtype": dtype}
        if phase not in budgeted:
            rows.append(Row(name, "pass", f"measured {human_bytes(got)} of live tensors at the phase's peak (the weights, and "
                            "what the trainer's thread made: an engine's own workers are not counted); not "
                            "simulated on CPU (the plan prices rollout by formula), so no ratio",
                            basis="measured", data=data))
            continue
        batches = peaks.batches.get(phase)
        if not batches:
            rows.append(skipped(name, "the phase ran, but no micro-batch of it went through the trainer's "
                                 "micro-batching, so there is none to simulate", **data))
            continue
        # each micro-batch it formed, simulated as it ran; the measured peak is over all of them
        planned, (lengths, width, resp, shared) = max((planned_step_bytes(cfg, dtype, phase, *b), b) for b in batches)
        ratio = got / planned
        layout = "packed" if cfg.model.padding_free else "padded"
        data.update(planned_bytes=planned, ratio=ratio, micro_batch=len(lengths), seq_len=width, response_len=resp,
                    rows=[list(r) for r in lengths], groups=list(shared) if shared else None,
                    plan_source=f"simulated: the same micro-batches ({layout}, as run)")
        prompts = len(set(shared)) if shared else len(lengths)
        sharing = f"; {prompts} prompts shared by {len(lengths)} rows" if prompts < len(lengths) else ""
        found = (f"measured {human_bytes(got)} / planned {human_bytes(planned)} = {ratio:.2f}x: live tensor bytes, "
                 f"both sides, {len(lengths)} rows x {width} tokens per micro-batch "
                 f"({sum(p + r for p, r in lengths)} real, {layout}{sharing}) in {dtype}")
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
