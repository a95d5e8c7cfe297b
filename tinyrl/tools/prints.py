"""A tool's prints: kept off the terminal and off a --json command's stdout.

A tool's `run` runs in the tinyrl process, on a thread of its own (tinyrl.tools.call_tool), and
`print` writes to sys.stdout, which every thread shares: until 2026-11-29 what a user's tool
printed landed above the live dashboard (a line per call, hundreds a step) and on `tinyrl eval
--json`'s stdout before the JSON. While a rollout with tools runs (tinyrl.rollout.turns), `routed`
makes sys.stdout and sys.stderr routers: what a tool call's thread writes goes to the run's
RUN_DIR/tool_prints.log (appended, so a resumed run adds to it; made at the first print; the
first MAX_PRINTS characters a process writes there, then one line saying the rest was dropped),
or to stderr where there is no run directory (eval); every other thread's writes go where they
went (Rich's live display, which swaps sys.stdout itself, is started before a rollout and
stopped after it, so a router always sits inside it).

A call given up on (past its timeout, tinyrl.tools.call_tool) runs on in its thread: while one
does, the routers stay after the rollout, so what it prints later goes to the same file (until
2026-11-29 onto the dashboard), and the next rollout takes them over rather than adding one
more. They go once no call runs at a rollout's end; Rich's display puts back its own stream when
the run ends, after which such a call's prints go where the process prints.

A tool's logging (its own `logging.warning`, a library's retry lines) goes the same way: the CLI's
handler passes a record made on a tool call's thread to `ToolCallLogs`, which writes it as the
call's print (until 2026-11-29 it went past the routers: a piped stderr's handler held the stream
it was made with, and Rich's handler, under the live display, wrote to the terminal beneath it).

Python-level writes only: a tool's C code or a program it starts writes to the process's fd 1
directly (the code tool's sandbox captures its programs' output itself).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from pathlib import Path
from typing import Iterator

from tinyrl.printsink import BoundedText

PRINTS_FILE = "tool_prints.log"  # RUN_DIR/: what the run's tools print
MAX_PRINTS = 10_000_000          # characters a process keeps of a file's tool prints (as rewards keep)

# .active: this thread is running a tool's call; .pending: its line so far (print writes a line
# in pieces, and calls run at once: whole lines keep the file readable); .sink: where it goes
_calling = threading.local()
_sinks: dict[Path, BoundedText] = {}
_sinks_lock = threading.Lock()
_calls = {"running": 0}  # threads inside a tool's call, those given up on included
_calls_lock = threading.Lock()


@contextlib.contextmanager
def in_tool_call() -> Iterator[None]:
    """Marks the calling thread as running a tool's call (call_tool's thread, for the call)."""
    _calling.active, _calling.pending, _calling.sink = True, "", None
    with _calls_lock:
        _calls["running"] += 1
    try:
        yield
    finally:
        _calling.active = False
        if _calling.pending and _calling.sink is not None:  # a last print without its newline
            _calling.sink.write(_calling.pending + "\n")
        _calling.pending, _calling.sink = "", None
        with _calls_lock:
            _calls["running"] -= 1


class _Router:
    """sys.stdout or sys.stderr while tools run: a tool call's thread writes to `sink`, any other
    thread to `stream` (what was there). Everything else is the stream's (encoding, isatty, fileno,
    rich's rich_proxied_file)."""

    def __init__(self, stream, sink):
        self._stream, self._sink = stream, sink

    @property
    def stream(self):
        """What was there before: where every other thread's writes go."""
        return self._stream

    def write(self, text: str) -> int:
        if not getattr(_calling, "active", False):
            return self._stream.write(text)
        lines, newline, _calling.pending = (_calling.pending + text).rpartition("\n")
        _calling.sink = self._sink
        if newline:
            self._sink.write(lines + newline)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    @property
    def buffer(self):
        """The stream's bytes beneath: a tool call's `sys.stdout.buffer.write(b"...")` is decoded and
        written as its print (until 2026-11-29 it reached the stream beneath the router)."""
        if getattr(_calling, "active", False):
            return _BytesAsText(self)
        return self._stream.buffer

    def flush(self) -> None:
        if not getattr(_calling, "active", False):
            self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _BytesAsText:
    """A tool call's `sys.stdout.buffer`: its bytes written to `router` as text (UTF-8, bad bytes
    replaced, as the prints file is written)."""

    def __init__(self, router: _Router):
        self._router = router

    def write(self, data) -> int:
        self._router.write(bytes(data).decode("utf-8", errors="replace"))
        return len(data)

    def flush(self) -> None:
        pass


class ToolCallLogs(logging.Filter):
    """On a logging handler: a record made on a tool call's thread is written as that call's print
    (to sys.stderr, which a rollout routes to RUN_DIR/tool_prints.log) instead of by the handler;
    every other record goes on to the handler."""

    _line = logging.Formatter("%(levelname)s %(name)s: %(message)s")

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(_calling, "active", False):
            return True
        sys.stderr.write(self._line.format(record) + "\n")
        return False


def _file_sink(path: Path) -> BoundedText:
    """One sink per file for the process's life, so that MAX_PRINTS bounds a run, not a rollout."""
    key = Path(path).absolute()
    with _sinks_lock:
        if key not in _sinks:
            _sinks[key] = BoundedText(lambda: open(key, "a", buffering=1, encoding="utf-8", errors="replace"),
                                      MAX_PRINTS, "the tools")
        return _sinks[key]


@contextlib.contextmanager
def routed(prints_to: Path | None) -> Iterator[None]:
    """While inside: a tool call's prints (stdout and stderr) to `prints_to`, or to stderr (None);
    after it too while a call given up on still runs (the module's docstring)."""
    # never a router itself: one left for a given-up call would write a tool's line to itself
    sink = _file_sink(prints_to) if prints_to is not None else _beneath(sys.stderr)
    out, err = _router_of(sys.stdout, sink), _router_of(sys.stderr, sink)
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        with _calls_lock:
            given_up_running = _calls["running"] > 0
        # put back what was there, unless a call still runs or something else swapped them meanwhile
        if not given_up_running and sys.stdout is out:
            sys.stdout = out.stream
        if not given_up_running and sys.stderr is err:
            sys.stderr = err.stream


def _beneath(stream):
    return stream.stream if isinstance(stream, _Router) else stream


def _router_of(stream, sink) -> _Router:
    """A router over `stream`; the one left by an earlier rollout for its given-up calls is taken
    over (a router in a router each rollout would nest as deep as the run is long)."""
    if isinstance(stream, _Router):
        stream._sink = sink
        return stream
    return _Router(stream, sink)
