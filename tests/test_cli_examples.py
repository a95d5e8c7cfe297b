"""Every command's --help shows a real example: walked from the Typer app itself (a new
command, or a task's `tinyrl data NAME`, is checked without being listed here), each example
parsed as the CLI would parse it, and shown whole at 80 and 200 columns."""

from __future__ import annotations

import inspect
import re
import shlex

import pytest
import typer
from typer.testing import CliRunner

from tinyrl.cli import app
from tinyrl.config import list_presets, load_config

ROOT = typer.main.get_command(app)
# "Example: tinyrl ..." or "Example (what it shows): tinyrl ...", a paragraph of its own; the
# command after a markdown hard break (a backslash): it starts a line (examples_on_lines_of_their_own)
EXAMPLE = re.compile(r"Example(?: \([^()]*\))?:\\ (tinyrl\b.*)")
WIDE = 78  # the longest example that fits a line of help at 80 columns


def _commands() -> list[tuple[tuple[str, ...], object]]:
    """(path, command) for the root, every group and every command under them."""
    found = []

    def walk(command, path, ctx):
        found.append((path, command))
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                walk(sub, (*path, name), typer.Context(sub, info_name=name, parent=ctx))

    walk(ROOT, (), typer.Context(ROOT, info_name="tinyrl"))
    return found


COMMANDS = _commands()
IDS = [" ".join(("tinyrl", *path)) for path, _ in COMMANDS]


def examples_of(help_text: str) -> list[str]:
    """The example commands of a help text: its paragraphs that start with "Example"."""
    found = []
    for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(help_text or "")):
        text = " ".join(paragraph.split())
        if text.startswith("Example"):
            match = EXAMPLE.fullmatch(text)
            assert match, f"not 'Example:\\ tinyrl ...' or 'Example (note):\\ tinyrl ...': {text!r}"
            found.append(match.group(1))
    return found


def parse(argv: list[str]):
    """argv (after `tinyrl`) parsed down to its command as the CLI would, nothing run: a flag that
    does not exist, a value of the wrong type, a missing required option or argument raise.
    -> the contexts from the root down."""
    command, name, args, ctx, contexts = ROOT, "tinyrl", argv, None, []
    while True:
        ctx = command.make_context(name, list(args), parent=ctx, resilient_parsing=False)
        contexts.append(ctx)
        rest = [*ctx._protected_args, *ctx.args] if hasattr(command, "resolve_command") else []
        if not rest:
            return contexts
        name, command, args = command.resolve_command(ctx, rest)


def test_the_walk_finds_every_command():
    """The walk is the tree: a walk that found nothing would pass every test below."""
    ids = set(IDS)
    for expected in ("tinyrl", "tinyrl train", "tinyrl sft", "tinyrl presets", "tinyrl presets show",
                     "tinyrl data", "tinyrl tasks", "tinyrl eval", "tinyrl export-verl"):
        assert expected in ids
    from tinyrl.tasks import all_tasks

    assert {f"tinyrl data {name}" for name in all_tasks()} <= ids


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_help_ends_with_examples_that_parse(path, command):
    examples = examples_of(command.help)
    assert 1 <= len(examples) <= 2, f"{' '.join(('tinyrl', *path))}: one or two examples, got {examples}"
    presets = list_presets()
    for example in examples:
        for i, line in enumerate(example.split(" && ")):  # a chain: each command parses on its own
            argv = shlex.split(line)
            argv = argv[:next((j for j, word in enumerate(argv) if word in (">", ">>", "|")), len(argv))]  # the shell's
            assert argv[0] == "tinyrl", example
            if i == 0:  # the example is of this command
                assert tuple(argv[1:1 + len(path)]) == path, f"{example!r} is not an example of {path}"
            try:
                contexts = parse(argv[1:])
            except typer.Exit as e:  # NoArgsIsHelpError and --help end this way
                pytest.fail(f"{example!r} ends with exit {e.exit_code}: no command there")
            except Exception as e:  # click's UsageError, BadParameter, MissingParameter, ...
                pytest.fail(f"{example!r} does not parse: {type(e).__name__}: {e}")
            leaf = contexts[-1]
            name = leaf.params.get("preset") or (leaf.params.get("name") if leaf.command_path.endswith(" show")
                                                 else None)
            if name is not None:
                assert name in presets, f"{example!r}: {name!r} is not a shipped preset (`tinyrl presets`)"
                cfg = load_config(name, leaf.params.get("overrides") or [], check=False)  # each --set key exists
                if leaf.info_name in ("train", "sft"):  # an SFT preset is run by `tinyrl sft`, others by train
                    assert cfg.command == leaf.info_name, example


@pytest.mark.parametrize("columns", [80, 200])
def test_examples_render_whole_on_lines_of_their_own(columns):
    """Typer's markdown mode reflows a paragraph and eats `*`, `_` pairs, backticks and [brackets]:
    the example must come out as written, on the line after its label; one that fits the width
    (at 80 columns: up to 78 characters) whole on that line, ready to copy. Until 2026-11-29 it
    followed its label, and at 80 columns 11 of 27 broke in the middle."""
    runner = CliRunner()
    checked = 0
    for (path, command), name in zip(COMMANDS, IDS):
        done = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)})
        assert done.exit_code == 0, (name, done.output)
        lines = [line.strip(" │") for line in done.output.splitlines()]
        text = " ".join(" ".join(lines).split())
        for example in examples_of(command.help):
            assert example in text, (name, columns, example)
            # the lines it may start on: right after its label
            starts = [line for i, line in enumerate(lines[1:], 1) if lines[i - 1].startswith("Example")
                      and line.startswith("tinyrl") and example.startswith(line)]
            assert starts, (name, columns, example)
            if len(example) <= (WIDE if columns == 80 else 150):
                assert example in starts, (name, columns, example)
                checked += 1
    assert checked >= (20 if columns == 80 else 25)


@pytest.mark.parametrize("command", ["train", "sft"])
def test_every_tasks_data_hint_is_a_command_that_parses(command):
    """The hint for a missing data file names a `tinyrl data TASK ...` the user can paste: every
    flag it gives exists. For `tinyrl sft` on math it said `tinyrl data math ... --sft`, and that
    command has no --sft (click: "No such option")."""
    from tinyrl.config import Config
    from tinyrl.tasks import all_tasks, data_hint

    checked = 0
    for name in all_tasks():
        cfg = Config(command=command)
        cfg.task.name = name
        hint = data_hint(cfg)
        for text in re.findall(r"`(tinyrl data [^`]*)`", hint):
            argv = shlex.split(text.replace("FILE|hf:NAME[:split]", "mine.jsonl").replace("DIR", "out"))
            parse(argv[1:])
            checked += 1
        assert hint, name
    assert checked >= len(all_tasks()) - 1  # math's SFT hint is a file of the user's, not a command
