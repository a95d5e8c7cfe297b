"""The run directory: resolved config, metrics.jsonl (+ parquet copy), samples, phase timeline.

    RUN_DIR/config.json      the resolved config (Config.to_dict())
    RUN_DIR/metrics.jsonl    one JSON object per step (each line written whole: see tinyrl.jsonl)
    RUN_DIR/metrics.parquet  the same, rewritten at each checkpoint and at the end
    RUN_DIR/samples.jsonl    sample completions with their rewards
    RUN_DIR/timeline.jsonl   one record per phase: when it began, memory in use then, and its peak
    RUN_DIR/checkpoints/     see tinyrl.checkpoint

A full disk does not stop training: a line that cannot be written is kept in memory and
written before the next line of its file once there is room again, or by `flush()` (the trainer
calls it before each checkpoint, after pruning made room: a checkpoint of step N with the records
of earlier steps only in memory would make --resume skip them for good); the first failure is
reported loudly (through `warn`), later ones are counted (`unwritten()`, `unwritten_steps()`).
Records still missing when a run resumes are named (`truncate_after` returns their steps).
"""

from __future__ import annotations

import json
import logging
import resource
import time
from pathlib import Path
from typing import Callable

import psutil
import torch

from tinyrl import jsonl
from tinyrl.words import step_ranges

log = logging.getLogger(__name__)
MAX_PENDING_LINES = 100_000  # per file; beyond this the oldest unwritten lines are dropped (counted)

def memory_reading(device: torch.device) -> dict:
    """Memory in use now, peak so far and the total: the card on CUDA, process RAM on CPU."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return {"memory/kind": "cuda", "memory/used_bytes": total - free,
                "memory/allocated_bytes": torch.cuda.memory_allocated(device),
                "memory/peak_bytes": torch.cuda.max_memory_allocated(device), "memory/total_bytes": total}
    rss = psutil.Process().memory_info().rss
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"memory/kind": "ram", "memory/used_bytes": rss, "memory/peak_bytes": max(peak, rss),
            "memory/total_bytes": psutil.virtual_memory().total}


def phase_peaks(device: torch.device) -> dict:
    """Peaks since the last reset: the card's allocator on CUDA, the process's peak RSS on CPU."""
    if device.type == "cuda":
        return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(device)}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"peak_allocated_bytes": rss, "peak_reserved_bytes": rss}


class RunLog:
    def __init__(self, run_dir: Path, device: torch.device, warn: Callable[[str], None] | None = None):
        self.dir = run_dir
        self.device = device
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.warn = warn or log.warning
        self._pending: dict[str, list[tuple[int | None, str]]] = {}  # file -> (step, line) not yet written
        self._dropped: dict[str, list[int | None]] = {}  # file -> steps of lines dropped for good
        self._warned = False
        self._parquet_warned = False  # "could not write metrics.parquet": said once, like DISK PROBLEM
        self.missing_before: list[int] = []  # metrics.jsonl's steps found missing at resume (truncate_after)
        self.on_phase: list[Callable[[str], None]] = []  # observers of phase transitions (tinyrl.interrupts)
        for name in ("metrics.jsonl", "samples.jsonl", "timeline.jsonl"):
            if jsonl.repair_tail(self.dir / name):  # a line cut by a crash: appending after it would bury it
                log.warning("%s: removed a cut-off last line left by a crash", name)

    def write_config(self, config: dict) -> None:
        jsonl.write_atomic(self.dir / "config.json", json.dumps(config, indent=2))

    def _append(self, name: str, record: dict) -> None:
        self._pending.setdefault(name, []).append((record.get("step"), json.dumps(record)))
        self._write_pending(name)

    def _write_pending(self, name: str) -> bool:
        """Write `name`'s pending lines, oldest first; True when none is left."""
        pending = self._pending.get(name, [])
        try:
            while pending:
                jsonl.append_line(self.dir / name, pending[0][1])
                pending.pop(0)
        except OSError as exc:
            if len(pending) > MAX_PENDING_LINES:
                cut = len(pending) - MAX_PENDING_LINES
                self._dropped.setdefault(name, []).extend(step for step, _ in pending[:cut])
                del pending[:cut]
            if not self._warned:
                self._warned = True
                self.warn(f"DISK PROBLEM: cannot write {self.dir / name} ({exc}). Training goes on; "
                          "log lines are kept in memory and written once there is room again. "
                          "Free disk space now.")
            return False
        return True

    def flush(self) -> bool:
        """Write every file's pending lines (a checkpoint calls this once pruning made room, before
        it writes itself); True when no line is left in memory."""
        return all([self._write_pending(name) for name in list(self._pending)])

    def unwritten(self) -> dict[str, int]:
        """Lines per file that are not on disk (still pending, or dropped)."""
        names = set(self._pending) | set(self._dropped)
        out = {n: len(self._pending.get(n, [])) + len(self._dropped.get(n, [])) for n in names}
        return {n: k for n, k in out.items() if k}

    def unwritten_steps(self, name: str = "metrics.jsonl") -> list[int]:
        """The steps whose lines of `name` are not on disk (pending or dropped), sorted."""
        steps = [s for s, _ in self._pending.get(name, [])] + self._dropped.get(name, [])
        return sorted({s for s in steps if s is not None})

    def metrics(self, record: dict) -> None:
        self._append("metrics.jsonl", record)

    def sample(self, record: dict) -> None:
        self._append("samples.jsonl", record)

    def phase(self, step: int, phase: str) -> dict:
        """A phase starts: closes the previous one with its PEAK, then resets the peak counter.

        The record of a phase says what it used: `peak_allocated_bytes` (CUDA: the allocator's
        max_memory_allocated since the phase began, reset at each phase start; CPU: the process's
        peak RSS so far, ru_maxrss -- Linux cannot reset it, so on CPU it is the high-water mark
        of the run up to the end of that phase, not the phase's own) and `peak_reserved_bytes`
        (CUDA: max_memory_reserved; CPU: the same RSS figure). `memory_bytes` stays what was in
        use when the phase began."""
        self.close_phase()
        mem = memory_reading(self.device)
        record = {"t": round(time.monotonic() - self.t0, 4), "step": step, "phase": phase,
                  "memory_bytes": mem["memory/used_bytes"], "memory_kind": mem["memory/kind"]}
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._open = record
        for observer in self.on_phase:
            observer(str(phase))
        return record

    def close_phase(self) -> dict | None:
        """Write the open phase's record with its peaks (called by the next phase, and at the end)."""
        record, self._open = getattr(self, "_open", None), None
        if record is None:
            return None
        record.update(phase_peaks(self.device))
        self._append("timeline.jsonl", record)
        return record

    def truncate_after(self, step: int) -> list[int]:
        """On resume: drop records of steps after the checkpoint (they will be redone). Each file
        is replaced whole (write_atomic), so a full disk here leaves it as it was.
        Returns the steps 1..`step` that metrics.jsonl has no record of: the checkpoint is past
        them, so they will not be redone (lines a full disk kept out until the run ended)."""
        missing = list(range(1, step + 1))
        for name in ("metrics.jsonl", "samples.jsonl", "timeline.jsonl"):
            path = self.dir / name
            if not path.exists():
                continue
            records = [r for r in jsonl.read_records(path) if r.get("step", 0) <= step]
            if name == "metrics.jsonl":
                have = {r.get("step") for r in records}
                missing = [s for s in missing if s not in have]
            jsonl.write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
        self.missing_before = missing
        return missing

    def missing_text(self) -> str:
        """What the final message says of metrics.jsonl's lost records ('' when none): those found
        missing at resume, and this run's lines still not on disk."""
        parts = []
        if self.missing_before:
            parts.append(f"metrics.jsonl has no records of steps {step_ranges(self.missing_before)} "
                         "(not written before the resume, they cannot be recovered)")
        now = self.unwritten_steps("metrics.jsonl")
        if now:
            parts.append(f"metrics.jsonl lacks steps {step_ranges(now)} (disk full)")
        return "; ".join(parts)

    def write_parquet(self) -> None:
        import pandas as pd

        self.close_phase()  # called at a checkpoint, the last thing a step (or the run) does

        path = self.dir / "metrics.jsonl"
        if not (path.exists() and path.stat().st_size):
            return
        tmp = self.dir / ".metrics.parquet.tmp"
        try:
            pd.DataFrame(jsonl.read_records(path)).to_parquet(tmp)
            tmp.replace(self.dir / "metrics.parquet")
        except OSError as exc:  # a full disk: metrics.jsonl has the same numbers
            tmp.unlink(missing_ok=True)
            if not self._parquet_warned:  # a disk warning is printed once (README)
                self._parquet_warned = True
                self.warn(f"could not write metrics.parquet ({exc}); metrics.jsonl holds the same records. "
                          "It is tried again at each checkpoint (said once).")
            else:
                log.info("could not write metrics.parquet (%s)", exc)
