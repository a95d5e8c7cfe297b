"""Where a user's code prints, bounded: the first `limit` characters written, then one line
saying the rest was dropped (a print of 100 kB per call would fill the disk in a long run).

One kind of sink for both places a user's code prints during a run: a reward function in its
worker process (tinyrl.rewards.worker: RUN_DIR/reward_prints.log) and a tool on its call's
thread (tinyrl.tools.prints: RUN_DIR/tool_prints.log). The stream is opened at the first write,
so a run whose code prints nothing leaves no empty file; writes from several threads (tool
calls run at once) keep whole. Standard library only.
"""

from __future__ import annotations

import io
import threading
from typing import Callable, TextIO


class BoundedText(io.TextIOBase):
    """A text stream that keeps the first `limit` characters written to it, then one line saying
    that `who` printed more and the rest is dropped. `open_stream()` makes the stream it writes to,
    at the first write."""

    def __init__(self, open_stream: Callable[[], TextIO], limit: int, who: str):
        self._open, self.limit, self.left, self.who = open_stream, limit, limit, who
        self._stream: TextIO | None = None
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            if self.left > 0 and text:
                if self._stream is None:
                    self._stream = self._open()
                kept = text[:self.left]
                self.left -= len(kept)
                self._stream.write(kept)
                if self.left == 0:
                    self._stream.write(f"\n[tinyrl: {self.who} printed more than {self.limit:,} characters; "
                                       "the rest is dropped]\n")
                self._stream.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.flush()
