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

Python-level writes only: a tool's C code or a program it starts writes to the process's fd 1
directly (the code tool's sandbox captures its programs' output itself). A call given up on that
prints after its rollout has ended prints where the process prints.
"""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def in_tool_call() -> Iterator[None]:
    """Marks the calling thread as running a tool's call (call_tool's thread, for the call)."""
    _calling.active, _calling.pending, _calling.sink = True, "", None
    try:
        yield
    finally:
        _calling.active = False
        if _calling.pending and _calling.sink is not None:  # a last print without its newline
            _calling.sink.write(_calling.pending + "\n")
        _calling.pending, _calling.sink = "", None


class _Router:
    """sys.stdout or sys.stderr while tools run: a tool call's thread writes to `sink`, any other
    thread to `stream` (what was there). Everything else is the stream's (encoding, isatty, fileno,
    rich's rich_proxied_file)."""

    def __init__(self, stream, sink):
        self._stream, self._sink = stream, sink

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

    def flush(self) -> None:
        if not getattr(_calling, "active", False):
            self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


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
    """While inside: a tool call's prints (stdout and stderr) to `prints_to`, or to stderr (None)."""
    sink = _file_sink(prints_to) if prints_to is not None else sys.stderr
    before = sys.stdout, sys.stderr
    out, err = _Router(sys.stdout, sink), _Router(sys.stderr, sink)
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:  # put back what was there, unless something else swapped them meanwhile
        if sys.stdout is out:
            sys.stdout = before[0]
        if sys.stderr is err:
            sys.stderr = before[1]
