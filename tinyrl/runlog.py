"""The run directory: resolved config, metrics.jsonl (+ parquet copy), samples, phase timeline.

    RUN_DIR/config.json      the resolved config (Config.to_dict())
    RUN_DIR/metrics.jsonl    one JSON object per step (appended, flushed: survives a kill)
    RUN_DIR/metrics.parquet  the same, rewritten at each checkpoint and at the end
    RUN_DIR/samples.jsonl    sample completions with their rewards
    RUN_DIR/timeline.jsonl   one record per phase: when it began, memory in use then, and its peak
    RUN_DIR/checkpoints/     see tinyrl.checkpoint
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import psutil
import torch


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
    def __init__(self, run_dir: Path, device: torch.device):
        self.dir = run_dir
        self.device = device
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()

    def write_config(self, config: dict) -> None:
        (self.dir / "config.json").write_text(json.dumps(config, indent=2))

    def _append(self, name: str, record: dict) -> None:
        with open(self.dir / name, "a") as fh:
            fh.write(json.dumps(record) + "\n")

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
        return record

    def close_phase(self) -> dict | None:
        """Write the open phase's record with its peaks (called by the next phase, and at the end)."""
        record, self._open = getattr(self, "_open", None), None
        if record is None:
            return None
        record.update(phase_peaks(self.device))
        self._append("timeline.jsonl", record)
        return record

    def truncate_after(self, step: int) -> None:
        """On resume: drop records of steps after the checkpoint (they will be redone)."""
        for name in ("metrics.jsonl", "samples.jsonl", "timeline.jsonl"):
            path = self.dir / name
            if not path.exists():
                continue
            kept = [line for line in path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= step]
            path.write_text("".join(line + "\n" for line in kept))

    def write_parquet(self) -> None:
        import pandas as pd

        self.close_phase()  # called at a checkpoint, the last thing a step (or the run) does

        path = self.dir / "metrics.jsonl"
        if path.exists() and path.stat().st_size:
            pd.read_json(path, lines=True).to_parquet(self.dir / "metrics.parquet")
