"""The one error type of tinyrl.

Library code raises `TinyRLError(message, hint=...)`; only the CLI prints it (one screen, no
traceback, exit code 2). `TINYRL_DEBUG=1` makes the CLI show the traceback too.
"""

from __future__ import annotations


class TinyRLError(Exception):
    """A problem the user can fix: what is wrong (`message`) and what to set (`hint`)."""

    def __init__(self, message: str, hint: str = "", exit_code: int = 2, resumable: bool = False):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
        # a stop that `--resume` continues once the cause is fixed (a user's reward that broke):
        # stopping a training run, the CLI adds the exact command to the hint
        self.resumable = resumable

    def __str__(self) -> str:
        return f"{self.message}\nhint: {self.hint}" if self.hint else self.message
