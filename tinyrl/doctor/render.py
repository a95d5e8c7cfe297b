"""The doctor's report on one screen (Rich renderables; the CLI prints them)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from tinyrl.doctor.report import Report
from tinyrl.words import counted

BASIS = {"simulated vs measured": "plan vs run"}  # short on screen; the JSON has the words
STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skipped": "dim"}


def render(report: Report) -> list:
    table = Table(title=f"tinyrl doctor · preset {report.preset} · {report.machine.get('platform', '')}",
                  show_lines=False, expand=True)
    table.add_column("check", style="bold", max_width=14)
    table.add_column("status", max_width=16)
    table.add_column("basis", style="dim", max_width=10)
    table.add_column("found  (→ fix)", ratio=1, min_width=30)
    for row in report.rows:
        found = Text(row.found)  # Text, not markup: findings contain [brackets] and paths
        if row.fix and row.status in ("fail", "warn"):
            found.append(f"\n→ fix: {row.fix}", style=STYLE[row.status])
        table.add_row(row.name, Text(row.label, style=STYLE[row.status]), BASIS.get(row.basis, row.basis) or "—", found)
    if report.failed:
        verdict = Text(f"{counted(len(report.failed), 'check')} failed: {', '.join(report.failed)} (exit code 1). ",
                       style="bold red")
    else:
        verdict = Text("all checks passed (exit code 0). ", style="bold green")
    verdict.append("A bug report: attach the output of `tinyrl doctor --preset "
                   f"{report.preset} --json --out doctor.json` (doctor.json).", style="")
    return [table, verdict]
