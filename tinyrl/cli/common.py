"""What every command shares: the Typer app and its groups, the two consoles, the options
used by several commands, and how a command says it was stopped or is working."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import sys
from typing import Callable, Iterator, Optional, Union

import typer
from rich.console import Console

from tinyrl.interrupts import stop_on_closed_stdout


def _flags_show_no_type() -> None:
    """Typer 0.29's help puts a type beside every option, flags too: `--resume <bool>` read as
    taking a value, and `--resume true` failed ("unexpected extra argument"). A flag (--resume,
    --greedy/--no-greedy, --help) is shown bare; other options keep their type. A Typer without
    that column is left as it is."""
    from typer import core

    shown = getattr(core.TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "flags_bare", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.flags_bare = True
    core.TyperOption.display_type_rich = display_type_rich


_flags_show_no_type()
app = typer.Typer(
    help="RL for language models (PPO with a critic, GRPO) on ONE GPU: Countdown, then maths.\n\n"
    "Start with `tinyrl presets`, then `tinyrl probe-memory`, `tinyrl estimate-cost` and "
    "`tinyrl train` with --preset NAME; each command's --help shows an example to copy.\n\n"
    "Example (the CPU demo, minutes, no GPU): tinyrl sft --preset countdown-demo-sft && tinyrl train --preset countdown-demo",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="markdown",  # a paragraph of the help flows at any width (rich kept its source line breaks)
)
presets_app = typer.Typer(help="List presets, or show one fully resolved.\n\nExample: tinyrl presets",
                          invoke_without_command=True)
# its example is a task's own (_register_data_commands): this layer names no task
data_app = typer.Typer(help="Make or convert training data for a task (`tinyrl tasks`); each task's command "
                       "has its own options (`tinyrl data NAME --help`).", no_args_is_help=True)
app.add_typer(presets_app, name="presets")
app.add_typer(data_app, name="data")

out = stop_on_closed_stdout(Console())  # `| head`: a run stops saved, not mid-step (exit 141)
err = Console(stderr=True)


def width_from_environment() -> None:
    """Both consoles take COLUMNS as it is now. Rich reads it once, when a Console is made (at
    import): a caller that imports tinyrl.cli and then calls main() with COLUMNS set (the tests,
    doctor's helpers) would otherwise get the width of whatever terminal was there at import,
    and a long error wraps differently with the length of its paths."""
    columns = os.environ.get("COLUMNS", "")
    for console in (out, err):
        console.width = int(columns) if columns.isdigit() else None  # None: the terminal's size


@contextlib.contextmanager
def said_if_stopped(after: Union[str, Callable[[], str]]) -> Iterator[None]:
    """Ctrl-C or SIGTERM in the body: one line, "stopped by SIGNAL" + `after` (what was under way,
    what is left on disk; a callable is asked then), and exit 130/143. Typer turns a
    KeyboardInterrupt into a silent exit 130 before main() sees it, so the signal is taken first
    (tinyrl.interrupts) and raised as Interrupted, which Typer lets through."""
    from tinyrl import interrupts

    interrupts.install()
    try:
        yield
    except interrupts.Interrupted as exc:
        said = after() if callable(after) else after
        err.print(f"stopped by {interrupts.SIGNAL_NAMES.get(exc.signum, exc.signum)}{said}",
                  highlight=False, soft_wrap=True, markup=False)
        sys.exit(interrupts.exit_code(exc.signum))


@contextlib.contextmanager
def working(text: str) -> Iterator:
    """err.status's spinner on a terminal. Piped (a log file, nohup, CI) Rich draws none, and a
    model's load or a plan's tracing said nothing for a minute or more: there the text is a line,
    and so is each update (the doctor's few)."""
    if err.is_terminal:
        with err.status(text) as status:
            yield status
        return
    from types import SimpleNamespace

    def say(message: str) -> None:
        err.print(message, highlight=False, soft_wrap=True, markup=False)

    say(text)
    yield SimpleNamespace(update=say)



def stops_cleanly(command: Callable, after: str) -> Callable:
    """`command` under said_if_stopped; functools.wraps keeps its signature, which Typer reads."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        with said_if_stopped(after):
            return command(*args, **kwargs)
    return run


PresetOpt = typer.Option(..., "--preset", "-p", help="Preset name (see `tinyrl presets`) or path to a .toml file.")
RunPresetOpt = typer.Option(None, "--preset", "-p", help="Preset name (see `tinyrl presets`) or path to a .toml "
                            "file; with --out RUN_DIR --resume, the run's own (kept in RUN_DIR/run.json).")


def typed(items: Optional[list[str]]):
    """The user's --set items, marked as typed (TypedSets): a key given twice among them is a
    config problem. Each command marks them as it gets them: Typer makes a plain list of what a
    callback returns."""
    from tinyrl.config import TypedSets

    return None if items is None else TypedSets(items)


SetOpt = typer.Option(None, "--set", "-s",
                      help="Override a setting, e.g. --set actor.lr=1e-6 (repeatable, one value per key: "
                      "a key given twice is refused).")
# train and sft
RunDirOpt = typer.Option(None, "--out", help="Run directory (default: runs/PRESET).")
MaxStepsOpt = typer.Option(None, help="End at this global step, before or past the preset's end (a resumed run counts on).")
ResumeOpt = typer.Option(False, "--resume", help="Continue from the latest checkpoint in the run directory.")
NoDashboardOpt = typer.Option(False, "--no-dashboard", help="Plain lines instead of the live dashboard.")



# Loggers whose INFO lines the user sees: one-off work on first use that takes a while (the tiny
# model's build, data generation). Others stay at WARNING: the trainer's INFO lines repeat what
# the dashboard already shows.
PROGRESS_LOGGERS = ("tinyrl.tiny_model", "tinyrl.setup")


def log_to_stderr() -> None:
    import logging

    from rich.logging import RichHandler

    from tinyrl.tools.prints import ToolCallLogs

    if err.is_terminal:
        handler, line = RichHandler(console=err, show_path=False, show_time=False), "%(message)s"
    else:  # piped (a log file, `| cat`): plain lines, where Rich padded each to the width and wrapped it
        handler, line = logging.StreamHandler(sys.stderr), "%(levelname)s %(message)s"
    handler.addFilter(ToolCallLogs())  # a tool's own logging: with its prints, off the terminal
    logging.basicConfig(level=logging.WARNING, format=line, handlers=[handler])
    # huggingface_hub gives its root logger a handler of its own and lets it propagate to ours as
    # well: each warning (an offline load's "Retrying in 1s", ten of them) came out twice
    import huggingface_hub.utils.logging  # noqa: F401  (adds that handler on import: remove it after)

    hub = logging.getLogger("huggingface_hub")
    for handler in [h for h in hub.handlers if type(h) is logging.StreamHandler]:
        hub.removeHandler(handler)
    for name in PROGRESS_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)


# "Example: tinyrl ..." or "Example (what it shows): tinyrl ...", to the end of its paragraph
_EXAMPLE = re.compile(r"^(Example(?: \([^()]*\))?:) (tinyrl\b.*?)(?=\n\s*\n|\Z)", re.MULTILINE | re.DOTALL)
EXAMPLE_WIDTH = 78  # the widest line of an example that shows whole in help at 80 columns
_WORD = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")  # a shell word, quotes kept whole


def example_lines(command: str, width: int = EXAMPLE_WIDTH) -> list[str]:
    """`command` as the lines it is shown on: each at most `width` characters (an option and its
    value wider than that on a line of their own; each command of a chain starting one), every
    line but the last ending in " \\", so that the lines copied from a terminal run as the one
    command (the shell joins a backslash-newline)."""
    if len(command) <= width:
        return [command]
    units: list[str] = []  # an option and its value stay on one line: "--set x=1", not "--set \\"
    for word in _WORD.findall(command):
        if units and units[-1].startswith("-") and " " not in units[-1] and not word.startswith("-"):
            units[-1] += " " + word
        else:
            units.append(word)
    lines: list[str] = []
    for i, unit in enumerate(units):
        ending = "" if i == len(units) - 1 else " \\"  # the last line needs no continuation
        chained = i > 0 and units[i - 1] in ("&&", "||")  # the next command of a chain: a line of its own
        if lines and not chained and len(lines[-1]) + 1 + len(unit) + len(ending) <= width:
            lines[-1] += " " + unit
        else:
            lines.append(unit)
    return [line + " \\" for line in lines[:-1]] + lines[-1:]


def examples_on_lines_of_their_own(typer_app: typer.Typer) -> None:
    """Every help's "Example (what it shows): tinyrl ..." paragraph starts its command on a line of
    its own (a markdown hard break after the label), so that it reads whole at 80 columns, ready to
    copy; one wider than EXAMPLE_WIDTH is shown on several lines joined by the shell's backslash-
    newline (example_lines). Until 2026-11-29 a command followed its label and wrapped in the
    middle; after that, one of over 78 characters (5 of 27) still wrapped where Rich chose, and
    pasted into a shell its first line ran alone (`tinyrl sft ... --set` with no value). Run once,
    after every command is registered (tinyrl.cli); groups included."""
    def shown(match: re.Match) -> str:
        # markdown: a backslash before a newline breaks the line; "\\" shows one backslash
        lines = example_lines(" ".join(match.group(2).split()))
        return match.group(1) + "\\\n" + "".join(line + "\\\\\n" for line in lines[:-1]) + lines[-1]

    def lines(text):
        return _EXAMPLE.sub(shown, text) if isinstance(text, str) else text

    typer_app.info.help = lines(typer_app.info.help)
    for info in typer_app.registered_commands:
        info.help = lines(info.help if info.help is not None else inspect.getdoc(info.callback))
    for group in typer_app.registered_groups:
        group.help = lines(group.help)
        examples_on_lines_of_their_own(group.typer_instance)
