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
WIDE = 78  # the widest line of an example that fits a line of help at 80 columns
# a long example's line break in the help's markdown: a backslash shown ("\\"), then a hard break
CONTINUED = " \\\\\\ "


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
            found.append(match.group(1).replace(CONTINUED, " "))
    return found


def typed_words(example: str) -> list[list[str]]:
    """The argv of each tinyrl command of `example` (a chain's split at &&; a redirect is the shell's)."""
    found = []
    for line in example.split(" && "):
        argv = shlex.split(line)
        found.append(argv[:next((j for j, word in enumerate(argv) if word in (">", ">>", "|")), len(argv))])
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
        for i, argv in enumerate(typed_words(example)):  # a chain: each command parses on its own
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


def shown_examples(output: str) -> list[list[str]]:
    """The examples of a rendered help, each as the lines it is shown on: from the line after its
    label to the first that does not end in a shell's line continuation (" \\")."""
    lines = [line.strip(" │") for line in output.splitlines()]
    found = []
    for i, line in enumerate(lines[1:], 1):
        if lines[i - 1].startswith("Example") and line.startswith("tinyrl"):
            end = i
            while lines[end].endswith(" \\") and end + 1 < len(lines):
                end += 1
            found.append(lines[i:end + 1])
    return found


def shell_words(lines: list[str], cwd) -> list[list[str]]:
    """What bash makes of `lines` pasted as they are, newlines included: the argv of each tinyrl
    command it runs (a function in tinyrl's place records them, nothing runs); a line that bash
    ran on its own shows as a command of its own, or as none."""
    import subprocess

    record = cwd / "argv"
    script = "set -f\ntinyrl() { printf '%s\\0' tinyrl \"$@\" >> argv; printf '\\n' >> argv; }\n" + "\n".join(lines)
    subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, timeout=10)
    commands = record.read_text().split("\n")[:-1] if record.exists() else []
    record.unlink(missing_ok=True)
    return [command.split("\0")[:-1] for command in commands]


@pytest.mark.parametrize("columns", [80, 200])
def test_examples_render_whole_on_lines_of_their_own(columns, tmp_path):
    """Typer's markdown mode reflows a paragraph and eats `*`, `_` pairs, backticks and [brackets]:
    the example must come out as written, starting on the line after its label, every line of it
    fitting 80 columns (up to 78 characters) and the lines, copied from the terminal, one command
    to bash. Until 2026-11-29 an example followed its label, and at 80 columns 11 of 27 broke in
    the middle; after that, the 5 of 27 over 78 characters still broke where Rich chose, and pasted,
    bash ran their first line alone (`tinyrl sft ... --set` with no value)."""
    runner = CliRunner()
    checked = continued = 0
    for (path, command), name in zip(COMMANDS, IDS):
        done = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)})
        assert done.exit_code == 0, (name, done.output)
        examples = examples_of(command.help)
        shown = shown_examples(done.output)
        assert len(shown) == len(examples), (name, columns, shown, examples)
        for example, lines in zip(examples, shown):
            assert all(len(line) <= WIDE for line in lines), (name, columns, lines)
            assert shell_words(lines, tmp_path) == typed_words(example), (name, columns, lines, example)
            checked += 1
            continued += len(lines) > 1
    assert checked >= 25 and continued >= 5


def test_a_long_example_is_broken_between_options_within_the_width():
    from tinyrl.cli.common import example_lines

    command = "tinyrl sft --preset p --set a.b='x y' --set c.d=1 --sft --out runs/long-name"
    assert example_lines(command) == [command]
    assert example_lines(command, width=40) == ["tinyrl sft --preset p --set a.b='x y' \\",
                                                "--set c.d=1 --sft --out runs/long-name"]
    assert example_lines(command, width=38) == ["tinyrl sft --preset p \\", "--set a.b='x y' --set c.d=1 --sft \\",
                                                "--out runs/long-name"]
    # an option and its value wider than the width: on a line of their own, not split
    assert example_lines("tinyrl eval --data aime=data/a-very-long-path.parquet --k 1", width=30) == [
        "tinyrl eval \\", "--data aime=data/a-very-long-path.parquet \\", "--k 1"]
    # a chain too wide for one line: its next command starts a line
    assert example_lines("tinyrl sft --preset a && tinyrl train --preset b", width=34) == [
        "tinyrl sft --preset a && \\", "tinyrl train --preset b"]
    assert all(len(line) <= 40 for line in example_lines(command, width=40))


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
