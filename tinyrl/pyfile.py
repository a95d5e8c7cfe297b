"""A user's Python file imported by its path (reward.fn = file.py:func, task.extra_tools =
file.py:NAME): the one way tinyrl does it, so both kinds of file load alike.

The module is named after the file's resolved path (two files called score.py stay two modules)
and put into sys.modules while its body runs and after (dataclasses and pickling look a module
up there); a body that raises leaves nothing behind. Standard library only: export-verl's files
import this where tinyrl is installed without its dependencies.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_file(path: Path, prefix: str) -> ModuleType | None:
    """`path` run as a module named `{prefix}_{stem}_{hash of its resolved path}`; None when
    Python cannot import it as a file at all (no loader). What its body raises is raised."""
    name = f"{prefix}_{path.stem}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
