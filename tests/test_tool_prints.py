"""A tool's prints (tinyrl.tools.prints): a tool runs on a thread of its own in the tinyrl
process, and what it prints went to the terminal above the dashboard, and onto `tinyrl eval
--json`'s stdout. While a rollout with tools runs, a tool call's prints go to the run's
RUN_DIR/tool_prints.log (or stderr), and every other thread's where they went."""

from __future__ import annotations

import io
import sys

import pytest

from tinyrl.tools import Tool, ToolResult, call_tool, prints


def _printing_tool() -> Tool:
    def run(arguments, create_kwargs, *, timeout_s, memory_mb):
        print("tool says", arguments["x"])
        print("tool warns", arguments["x"], file=sys.stderr)
        sys.stdout.writelines(["tool lines\n"])
        sys.stdout.buffer.write(b"tool bytes\n")
        return ToolResult(stdout=f"{arguments['x']}\n", stderr="", exit_code=0)

    return Tool("loud", {"type": "function", "function": {"name": "loud"}}, run)


def _call(tool: Tool, x: int) -> ToolResult:
    return call_tool(tool, {"x": x}, {}, timeout_s=5, memory_mb=256)


def test_a_tool_calls_prints_go_to_the_file_and_everything_else_where_it_went(tmp_path, capsys):
    tool = _printing_tool()
    before = sys.stdout, sys.stderr
    log = tmp_path / "run" / prints.PRINTS_FILE
    log.parent.mkdir()
    with prints.routed(log):
        assert not log.exists()  # made at the first print: a run whose tools print nothing has no file
        print("the trainer's line")
        print("the trainer's warning", file=sys.stderr)
        assert _call(tool, 1).stdout == "1\n" and _call(tool, 2).stdout == "2\n"  # the tool's result is its own
    assert (sys.stdout, sys.stderr) == before
    assert log.read_text() == ("tool says 1\ntool warns 1\ntool lines\ntool bytes\n"
                               "tool says 2\ntool warns 2\ntool lines\ntool bytes\n")
    seen = capsys.readouterr()
    assert (seen.out, seen.err) == ("the trainer's line\n", "the trainer's warning\n")

    _call(tool, 3)  # outside a rollout: where the process prints, as before
    assert "tool says 3" in capsys.readouterr().out
    with prints.routed(log):  # a resumed run appends
        _call(tool, 4)
    assert log.read_text().endswith("tool says 4\ntool warns 4\ntool lines\ntool bytes\n") and "tool says 1" in log.read_text()


def test_without_a_run_directory_a_tools_prints_go_to_stderr(capsys):
    """eval: `--json` prints one object on stdout; the tool's lines go to stderr."""
    with prints.routed(None):
        _call(_printing_tool(), 7)
    seen = capsys.readouterr()
    assert seen.out == "" and "tool says 7" in seen.err and "tool warns 7" in seen.err


def test_a_tools_prints_are_bounded_per_file(tmp_path, monkeypatch):
    monkeypatch.setattr(prints, "MAX_PRINTS", 30)
    log = tmp_path / prints.PRINTS_FILE
    for x in range(3):  # three rollouts of one run: one bound
        with prints.routed(log):
            _call(_printing_tool(), x)
    text = log.read_text()
    assert text == ("tool says 0\ntool warns 0\ntool "  # 30 characters
                    "\n[tinyrl: the tools printed more than 30 characters; the rest is dropped]\n")


def test_inside_a_live_dashboard_a_tools_prints_stay_off_the_screen(tmp_path):
    """Rich's Live swaps sys.stdout for a proxy that prints above the display; the router sits
    inside it (a rollout runs while the dashboard is up), so a tool's line never reaches the
    screen, and the trainer's still do, above the display."""
    from rich.console import Console
    from rich.live import Live

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=60)
    before = sys.stdout
    log = tmp_path / prints.PRINTS_FILE
    with Live("dashboard", console=console, auto_refresh=False):
        proxied = sys.stdout
        assert proxied is not before  # Live redirected it
        with prints.routed(log):
            _call(_printing_tool(), 5)
            print("the trainer's line")
        assert sys.stdout is proxied
    assert sys.stdout is before
    assert "tool" not in screen.getvalue() and "the trainer's line" in screen.getvalue()
    assert "tool says 5" in log.read_text()


def test_lines_stay_whole_when_calls_print_at_once(tmp_path):
    """print() writes a line in pieces (each argument, the separators, the newline) and a rollout
    runs many calls at once: the file gets whole lines, a last one without its newline too."""
    from concurrent.futures import ThreadPoolExecutor

    def run(arguments, create_kwargs, *, timeout_s, memory_mb):
        for i in range(50):
            print("call", arguments["x"], "line", i, "of", 50)
        print("no newline from", arguments["x"], end="")
        return ToolResult(stdout="", stderr="", exit_code=0)

    tool = Tool("chatty", {"type": "function", "function": {"name": "chatty"}}, run)
    log = tmp_path / prints.PRINTS_FILE
    with prints.routed(log), ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda x: _call(tool, x), range(8)))
    lines = log.read_text().splitlines()
    assert sorted(lines) == sorted([f"call {x} line {i} of 50" for x in range(8) for i in range(50)]
                                   + [f"no newline from {x}" for x in range(8)])


def test_the_end_of_a_run_says_where_the_prints_went(tmp_path, capsys):
    from tinyrl.cli.run import _say_user_prints

    (tmp_path / "tool_prints.log").write_text("tool says 1\n")
    (tmp_path / "reward_prints.log").write_text("")  # empty: not said
    _say_user_prints(tmp_path)
    out = capsys.readouterr().out
    assert out == f"your tools' prints (12 bytes): {tmp_path / 'tool_prints.log'}\n"


def test_a_call_given_up_on_still_prints_to_the_file_after_its_rollout(tmp_path, capsys):
    """A call past its timeout is given up (tinyrl.tools.call_tool) and runs on in its thread:
    what it printed after its rollout had ended went onto the terminal, above the dashboard.
    The routers now stay while such a call runs; the next rollouts take them over (one router,
    not one more a rollout), and they go at the end of the first rollout after no call runs."""
    import threading

    release, slow_threads = threading.Event(), []

    def run(arguments, create_kwargs, *, timeout_s, memory_mb):
        slow_threads.append(threading.current_thread())
        release.wait(60)
        print("late line of call", arguments["x"])
        return ToolResult(stdout="", stderr="", exit_code=0)

    tool = Tool("slow", {"type": "function", "function": {"name": "slow"}}, run, grace_s=0.0)
    before = sys.stdout, sys.stderr
    log = tmp_path / prints.PRINTS_FILE
    for x in range(3):  # three rollouts of a run, each with a call given up on
        with prints.routed(log):
            assert call_tool(tool, {"x": x}, {}, timeout_s=0.05, memory_mb=256).timed_out
        print("the trainer's line", x)
    assert isinstance(sys.stdout, prints._Router) and sys.stdout.stream is before[0]  # one deep
    assert isinstance(sys.stderr, prints._Router) and sys.stderr.stream is before[1]
    release.set()
    for thread in slow_threads:
        thread.join(60)
    assert sorted(log.read_text().splitlines()) == [f"late line of call {x}" for x in range(3)]
    assert capsys.readouterr().out == "".join(f"the trainer's line {x}\n" for x in range(3))
    with prints.routed(log):  # no call runs at its end: what was there is put back
        pass
    assert (sys.stdout, sys.stderr) == before

    release.clear()  # a call left running, then prints routed to stderr (eval's): to stderr, not
    with prints.routed(log):  # to the router left in place (a line written to itself, forever)
        assert call_tool(tool, {"x": 3}, {}, timeout_s=0.05, memory_mb=256).timed_out
    with prints.routed(None):
        _call(_printing_tool(), 8)
    release.set()
    slow_threads[-1].join(60)
    seen = capsys.readouterr()
    assert seen.out == "" and "tool says 8" in seen.err and "late line of call 3" in seen.err
    with prints.routed(None):
        pass
    assert (sys.stdout, sys.stderr) == before


@pytest.mark.parametrize(("tty", "handler"), [("0", "StreamHandler"), ("1", "RichHandler")])
def test_a_tools_logging_goes_with_its_prints_through_the_clis_handler(tmp_path, tty, handler):
    """A tool's `logging.warning` (its own, or a library's retry line) went through the handler
    the CLI installs (tinyrl.cli.common.log_to_stderr), which held the stderr it was made with:
    onto the terminal or the piped log, past RUN_DIR/tool_prints.log. A process as the CLI sets it
    up, its stderr piped, and taken for a terminal (Rich's TTY_COMPATIBLE) under a live display,
    or not; the trainer's own warnings still reach stderr."""
    import os
    import subprocess
    import textwrap

    code = textwrap.dedent(f"""
        import logging, sys
        from pathlib import Path
        from rich.console import Console
        from rich.live import Live
        from tinyrl.cli.common import log_to_stderr
        from tinyrl.tools import Tool, ToolResult, call_tool, prints

        log_to_stderr()
        print(type(logging.getLogger().handlers[0]).__name__)

        def run(arguments, create_kwargs, *, timeout_s, memory_mb):
            logging.getLogger("their.library").warning("retrying in %d s", 1)
            try:
                raise ValueError("bad input")
            except ValueError:
                logging.getLogger("their.tool").exception("it failed")
            return ToolResult(stdout="", stderr="", exit_code=0)

        tool = Tool("logs", {{"type": "function", "function": {{"name": "logs"}}}}, run)
        with Live("dashboard", console=Console()):  # redirects sys.stdout and stderr on a terminal
            with prints.routed(Path({str(tmp_path / prints.PRINTS_FILE)!r})):
                call_tool(tool, {{}}, {{}}, timeout_s=5, memory_mb=256)
                logging.getLogger("tinyrl.trainer").warning("the trainer warns")
        call_tool(tool, {{}}, {{}}, timeout_s=5, memory_mb=256)  # outside a rollout: where the process prints
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TTY_COMPATIBLE": tty})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{handler}\n")
    kept = (tmp_path / prints.PRINTS_FILE).read_text()
    assert kept.startswith("WARNING their.library: retrying in 1 s\nERROR their.tool: it failed\nTraceback")
    assert "ValueError: bad input" in kept
    assert done.stderr.count("retrying in 1 s") == 1  # the call outside a rollout only
    assert "the trainer warns" in done.stderr and "the trainer warns" not in kept
