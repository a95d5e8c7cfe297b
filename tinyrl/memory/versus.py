"""The memory plan held against what a run measured, per phase (issue 20, item 6).

The plan's phase peak is everything on the card; the run measures the trainer's allocator. So the
comparable planned figure leaves out what lies outside the trainer's tensors (CUDA context, vLLM
asleep or its reservation) and, for `allocated`, the allocator headroom (blocks reserved, not held by tensors):
    planned allocated = peak - outside - allocator   <->  measured peak_allocated_bytes
    planned reserved  = peak - outside               <->  measured peak_reserved_bytes
Measured figures come from the run's timeline.jsonl (tinyrl.runlog: each phase's peak, reset at
its start on CUDA). On the CPU they are the process's RSS high-water mark, not a phase's own
peak, and no plan is made: the comparison is for CUDA runs.

Knows: the plan's JSON (from_config.plan_dict), timeline records. Does not know: how either is made.
"""

from __future__ import annotations

import json
from pathlib import Path

from tinyrl import jsonl

RUN_PLAN_FILE = "memory_plan.json"
# Not this process's tensors: the CUDA context; vLLM asleep; vLLM's reservation while it rolls out
# (its own memory pool: the rollout row compares the trainer's resident share only).
OUTSIDE_PARTS = ("cuda_context", "vllm_asleep", "vllm_reserved")


def run_plan_record(plan_json: dict) -> dict:
    """plan_dict(...) -> what a run keeps: per phase the planned allocated/reserved bytes and
    micro-batch, plus the budget and the card."""
    phases = {}
    for name, ph in plan_json["phases"].items():
        parts = ph.get("parts", {})
        reserved = ph["peak_bytes"] - sum(parts.get(k, 0) for k in OUTSIDE_PARTS)
        phases[name] = {"planned_reserved_bytes": reserved,
                        "planned_allocated_bytes": reserved - parts.get("allocator", 0),
                        "micro_batch": ph.get("micro_batch", 0)}
    return {"gpu": plan_json.get("gpu"), "budget_bytes": plan_json.get("budget_bytes"),
            "simulated": plan_json.get("simulated"), "phases": phases}


def write_run_plan(run_dir: Path, plan_json: dict) -> Path:
    """RUN_DIR/memory_plan.json: the plan this run trains with (rewritten on resume: the run's own)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_PLAN_FILE
    jsonl.write_atomic(path, json.dumps(run_plan_record(plan_json), indent=2))
    return path


def read_run_plan(run_dir: Path) -> dict | None:
    """The run's plan record, or None (a CPU run, a run from before this file, or unreadable)."""
    path = Path(run_dir) / RUN_PLAN_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record.get("phases"), dict) else None


def measured_peaks(timeline: list[dict]) -> dict[str, dict]:
    """Per phase over the whole run: the largest peak_allocated_bytes and peak_reserved_bytes,
    and the memory kind ("cuda" or "ram"). Records without peaks (older runs) are skipped."""
    out: dict[str, dict] = {}
    for r in timeline:
        alloc = r.get("peak_allocated_bytes")
        if not isinstance(alloc, (int, float)):
            continue
        m = out.setdefault(str(r.get("phase")), {"allocated": 0, "reserved": 0, "kind": r.get("memory_kind")})
        m["allocated"] = max(m["allocated"], alloc)
        m["reserved"] = max(m["reserved"], r.get("peak_reserved_bytes") or 0)
    return out


def compare(plan: dict | None, measured: dict[str, dict]) -> list[dict]:
    """One row per planned phase (then any measured phase the plan has no figure for):
    {phase, planned, measured, ratio (measured / planned allocated), reserved, planned_reserved}.
    Missing figures are None."""
    planned = (plan or {}).get("phases", {})
    rows = []
    for name in list(planned) + [n for n in measured if n not in planned]:
        p, m = planned.get(name, {}), measured.get(name, {})
        pa, ma = p.get("planned_allocated_bytes"), m.get("allocated")
        rows.append({"phase": name, "planned": pa, "measured": ma, "reserved": m.get("reserved"),
                     "planned_reserved": p.get("planned_reserved_bytes"), "micro_batch": p.get("micro_batch"),
                     "ratio": ma / pa if pa and ma is not None else None, "kind": m.get("kind")})
    return rows


def table_lines(rows: list[dict]) -> list[str]:
    """Plain-text table for summary.txt: GiB, and measured / planned."""
    def g(v):
        return "-" if v is None else f"{v / 2**30:.2f}"

    lines = [f"{'phase':<14} {'planned':>8} {'measured':>9} {'ratio':>6} {'reserved':>9} {'planned+hdrm':>12}"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"{r['phase']:<14} {g(r['planned']):>8} {g(r['measured']):>9} {ratio:>6} "
                     f"{g(r['reserved']):>9} {g(r['planned_reserved']):>12}")
    return lines
