"""probe-memory's report as Rich renderables (tables and text); the CLI prints them.

Knows: how a plan and a CPU-probe result read on screen. Does not know how either is made
(from_config.py, plan.py, probe.py).
"""

from __future__ import annotations

import copy
from pathlib import Path

from tinyrl.config import Config
from tinyrl.memory.formulas import GiB
from tinyrl.memory.from_config import TRAINING_PHASES, advice, apply_plan, categories
from tinyrl.memory.plan import MemoryPlan
from tinyrl.phases import Phase

_SIM = "SIMULATED (fake-tensor trace on CPU, no GPU used)"


def render_plan(cfg: Config, plan: MemoryPlan, path: Path, out_path: Path | None, seconds: float,
                cached: bool = True) -> list:
    """Rich renderables for probe-memory's report; the CLI prints them. `cached`: whether the plan
    was written to `path`, the file train reads (a --budget plan that does not fit is not)."""
    from rich.table import Table
    from rich.text import Text

    g = lambda n: f"{n / GiB:.2f}" if n else "-"  # noqa: E731
    head = Text(f"{plan.model} on {plan.gpu}: card {plan.card_bytes / GiB:.2f} GiB, every phase must stay "
                f"under {plan.budget_bytes / GiB:.2f} GiB ({plan.budget_bytes / plan.card_bytes:.0%} of it)\n")
    head.append(_SIM if plan.simulated else "MEASURED on this card (training phases)"
                + ("" if Phase.ROLLOUT not in plan.phases else "; rollout from formulas"),
                style="bold yellow")
    head.append(f"  ·  planned in {seconds:.1f} s")
    cats = categories(cfg, plan)
    table = Table(title="GiB on the card, phase by phase (a step runs the phases one after another)")
    table.add_column("category")
    for name in plan.phases:
        table.add_column(name, justify="right")
    for cat in next(iter(cats.values())):
        values = [cats[name][cat] for name in plan.phases]
        if any(values):
            table.add_row(cat, *(g(v) for v in values))
    table.add_row("[bold]total (peak)[/]", *(f"[bold {'green' if p.fits else 'red'}]{g(p.peak)}[/]"
                                             for p in plan.phases.values()))
    table.add_row("margin to the card", *(g(plan.card_bytes - p.peak) for p in plan.phases.values()))
    command = cfg.command  # `tinyrl train` or `tinyrl sft` reads the plan
    chosen = Table(title=f"settings {command} will use" if plan.fits else
                   f"what each phase could hold ({command} will not start on this plan)")
    chosen.add_column("phase")
    chosen.add_column("micro-batch (sequences)", justify="right")
    chosen.add_column("token budget", justify="right")
    for name, ph in plan.phases.items():
        if name in TRAINING_PHASES:
            chosen.add_row(name, str(ph.micro_batch), f"{ph.token_budget:,}")
    if plan.vllm_gpu_memory_utilization:
        chosen.add_row("rollout (vLLM)", f"{plan.vllm_max_num_seqs} at once",
                       f"gpu_memory_utilization {plan.vllm_gpu_memory_utilization:.2f}")
    parts = [head, table, chosen]
    if plan.fits:
        parts.append(Text("FITS: every phase is under the budget", style="bold green"))
    else:
        parts.append(Text("DOES NOT FIT\n", style="bold red").append("\n".join(f"- {a}" for a in advice(cfg, plan))))
    where = f"plan written to {path}" + (f" and {out_path}" if out_path else "")
    if plan.fits:
        filled = apply_plan(copy.deepcopy(cfg), plan)
        if filled:
            parts.append(Text(f"{command} sets:\n" + "\n".join(f"- {line}" for line in filled)))
        parts.append(Text(f"{where}\n`tinyrl {command} --preset {cfg.preset_arg}` with the same --set options reads it.",
                          style="dim"))
    elif cached:  # train refuses this plan (preflight.check_memory): do not list settings it will never use
        parts.append(Text(f"{where}\n`tinyrl {command} --preset {cfg.preset_arg}` with the same --set options stops "
                          "on this plan: make a change above and probe again"
                          + ("" if plan.simulated else ", or free the memory other processes hold on the card, "
                             "which counted against this measurement, and probe again") + ".", style="dim"))
    else:
        kept = "the plan there is left as it was" if path.exists() else "none is there yet: it plans one when it starts"
        parts.append(Text(f"this --budget plan does not fit, so it was NOT written to {path}, the plan "
                          f"`tinyrl {command} --preset {cfg.preset_arg}` with the same --set options reads: {kept}"
                          + (f"\nplan written to {out_path}" if out_path else ""), style="dim"))
    parts.append(Text("\n".join(f"- {n}" for n in plan.notes), style="dim"))
    return parts


def render_cpu_probe(result: dict) -> list:
    from rich.text import Text

    r, mib = result, 2**20
    text = Text("CPU twin of the GPU probe: real passes in RAM, not VRAM\n", style="bold yellow")
    text.append(f"{r['model']} {r['phase']} ({r['dtype']}, {r['seq_len']} tokens per sequence), in a child "
                f"process whose address space may grow by {r['memory_limit_bytes'] / mib:,.0f} MiB beyond the "
                f"{r['child_baseline_vm_bytes'] / mib:,.0f} MiB it maps once torch and the model are loaded "
                "(RLIMIT_AS)\n\n")
    b = r["max_micro_batch"]
    text.append(f"largest micro-batch that really ran: {b} sequences ({r['token_budget']:,} tokens)",
                style="bold green" if b else "bold red")
    text.append(f"  [searched 1..{r['searched_up_to']}, the sequences one optimizer step can use]\n")
    if b:
        down = r.get("stepped_down", 0)
        text.append(f"evidence: {b} ran again after the search: {'yes' if r['reruns'] else 'NO'}"
                    + (f" (the search found {b + down}, which then failed: stepped down {down})" if down else "")
                    + "; ")
        text.append(f"{2 * b} failed in the allocator: {r['double_error'].splitlines()[0][:160]}"
                    if r["double_error"] else f"{2 * b} ran too: the limit is above what one step can use")
    else:
        text.append("not even one sequence fits under this limit: raise --memory-limit")
    text.append(f"\nsearch {r['search_seconds']:.1f} s, {r['total_seconds']:.1f} s with the child's start-up")
    return [text, Text("No plan file written: a CPU run uses the preset's micro-batch budgets; "
                       "plan a card with --simulate --gpu NAME.", style="dim")]
