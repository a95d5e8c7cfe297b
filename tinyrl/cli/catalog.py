"""`tinyrl presets`, `tinyrl presets show`, `tinyrl tasks` and each task's `tinyrl data NAME`."""

from __future__ import annotations

import inspect
import json
from typing import Optional

import typer
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tinyrl.cli.common import SetOpt, app, data_app, err, out, presets_app, stops_cleanly, typed
from tinyrl.words import counted


@presets_app.callback()
def presets_list(ctx: typer.Context) -> None:
    """List the presets with one line each."""
    if ctx.invoked_subcommand:
        return
    from tinyrl.config import list_presets, load_config

    table = Table(title="tinyrl presets", show_lines=False)
    table.add_column("preset", style="bold cyan")
    table.add_column("run with")  # an SFT preset's is `tinyrl sft`: the footer said `train` of every one
    table.add_column("description")
    for name in list_presets():
        cfg = load_config(name, check=False)
        table.add_row(name, f"tinyrl {cfg.command}", cfg.description)
    out.print(table)
    out.print("Show one: [bold]tinyrl presets show NAME[/]  ·  run one: [bold]tinyrl train --preset NAME[/] "
              "(an SFT preset: [bold]tinyrl sft[/], as its 'run with' says)")


@presets_app.command("show")
def presets_show(
    name: str = typer.Argument(..., metavar="NAME", help="Preset name or path to a .toml file."),
    overrides: Optional[list[str]] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of TOML-like text."),
) -> None:
    """Print the fully resolved config of a preset (defaults + file + --set overrides).

    Example (a preset of your own): tinyrl presets show countdown-tiny --set rollout.n=8 > mine.toml
    """
    from tinyrl.config import load_config, problems_of

    cfg = load_config(name, typed(overrides), check=False)
    if as_json:
        print(json.dumps(cfg.to_dict(), indent=2))
    else:
        out.print(f"# preset {cfg.preset}: {cfg.description}", soft_wrap=True)
        # no `preset = ...` line: saved as mine.toml, this text is a preset named mine (a file's
        # name is its preset's name; load_config refuses the key)
        _print_sections({k: v for k, v in cfg.to_dict().items() if k != "preset"})
    problems = problems_of(cfg)
    if problems:  # printed in full above; exit 2 as `train` would refuse it (scripts see it too)
        # the same "what to do" as train's refusal (tinyrl.config's problems hint): it is the same config
        err.print(Panel("\n".join(f"- {p}" for p in problems) + "\n\nwhat to do: fix each as it says (a setting: with "
                        "--set key.sub=value or in the printed file)", border_style="red",
                        title=f"{counted(len(problems), 'problem')}: `tinyrl {cfg.command}` refuses this config"))
        raise typer.Exit(2)


def _print_sections(tree: dict, prefix: str = "") -> None:
    flat = {k: v for k, v in tree.items() if not isinstance(v, dict)}
    if prefix and flat:
        out.print()
        out.print(Text(f"[{prefix}]", style="bold"))  # Text: the brackets are TOML, not markup
    for key, value in flat.items():
        out.print(f"{key} = {json.dumps(value)}", highlight=False, soft_wrap=True, markup=False)
    for key, value in tree.items():
        if isinstance(value, dict):
            _print_sections(value, f"{prefix}.{key}" if prefix else key)



def _register_data_commands() -> None:
    """`tinyrl data TASK ...`: each task brings its own command (tinyrl/tasks/)."""
    from tinyrl.tasks import all_tasks

    for name, task in all_tasks().items():
        data_app.command(name)(stops_cleanly(task.data_command, f" while writing the {name} data; no data "
                                              "file was written"))
    # `tinyrl data --help`'s example: the first task's first, taken from its command's help (one source)
    first = next(iter(all_tasks().values())).data_command.__doc__ or ""
    example = next((p for p in inspect.cleandoc(first).split("\n\n") if p.startswith("Example")), None)
    if example:
        data_app.info.help += "\n\n" + example



_register_data_commands()


@app.command("tasks")
def tasks_list() -> None:
    """List the tasks (task.name), their templates and how to make their data.

    Example: tinyrl tasks
    """
    from tinyrl.tasks import all_tasks

    table = Table(title="tinyrl tasks")
    table.add_column("task", style="bold cyan")
    table.add_column("templates")
    table.add_column("description")
    table.add_column("data", overflow="fold")  # a command to copy: wrapped anywhere, never cut with "…"
    for name, task in all_tasks().items():
        table.add_row(name, ", ".join(task.templates), task.description, task.data_hint)
    out.print(table)
    out.print("Use one: [bold]--set task.name=NAME[/] (presets set it)  ·  data: [bold]tinyrl data NAME --help[/]")
    # one line whatever the width: a command to copy, not one split where the terminal ends
    out.print("Tools of your own (README, \"Your own tools\"), offered after a task's: "
              "[bold]--set 'task.extra_tools=\\[\"file.py:NAME\"]'[/]", soft_wrap=True)
