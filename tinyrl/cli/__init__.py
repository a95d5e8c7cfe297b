"""The `tinyrl` command line. Thin commands; the only place that prints library errors.

Every command that takes --preset also takes repeatable `--set key.sub=value` overrides (each
key once: a key given twice is refused as ambiguous).
Errors: a TinyRLError becomes one screen (what is wrong + what to set) and exit code 2;
TINYRL_DEBUG=1 adds the traceback.
"""

from __future__ import annotations

import os
import sys
import traceback

from rich.panel import Panel
from rich.text import Text

from tinyrl.cli.common import app, err, examples_on_lines_of_their_own, width_from_environment
# Each module adds its commands to `app` on import; `tinyrl --help` lists them in this order.
from tinyrl.cli import catalog, run, machine, results, exports  # noqa: E402,F401  isort: skip
from tinyrl.errors import TinyRLError

examples_on_lines_of_their_own(app)  # every command is registered by now

__all__ = ["app", "main"]


def main() -> None:
    from tinyrl._compat import quiet_library_deprecations

    width_from_environment()
    quiet_library_deprecations()
    try:  # no KeyboardInterrupt reaches here (Typer exits 130 on it): see said_if_stopped
        app()
    except TinyRLError as exc:
        if os.environ.get("TINYRL_DEBUG"):
            traceback.print_exc()
        body = Text(exc.message)  # Text, not markup: messages contain [brackets]
        if exc.hint:
            body.append("\n\nwhat to do: ", style="bold").append(exc.hint)
        err.print(Panel(body, title="tinyrl: error", border_style="red", expand=False))
        sys.exit(exc.exit_code)
