"""A user's Python file imported by its path (reward.fn = file.py:func, task.extra_tools =
file.py:NAME): the one way tinyrl does it, so both kinds of file load alike.

The module is named after the file's resolved path (two files called score.py stay two modules)
and put into sys.modules while its body runs and after (dataclasses and pickling look a module
up there); a body that raises leaves nothing behind. Its directory is NOT put on sys.path: the
file stands alone, as export-verl copies it (one file, no neighbours), and a neighbour called
like a library module would shadow it for the whole run. `import_failure_hint` says so when a
file imports a module beside it. Standard library only: export-verl's files import this where
tinyrl is installed without its dependencies.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_file(path: Path, prefix: str) -> ModuleType | None:
    """`path` run as a module named `{prefix}_{stem}_{digest of its resolved path}`; None when
    Python cannot import it as a file at all (no loader). What its body raises is raised."""
    # a digest, not hash(): str hashes differ between processes (PYTHONHASHSEED), so an object of
    # a class the file defines did not unpickle in another process that imported the same file
    name = f"{prefix}_{path.stem}_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}"
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


def import_failure_hint(path: Path, error: BaseException) -> str:
    """What to do when importing `path` raised `error`. A module it imports that sits beside it
    is the likely case (`python FILE` runs it, since Python puts a script's directory on the
    path): say that the file stands alone. Otherwise how to see the whole error as tinyrl met it
    (`python -P`: without the file's directory on the path)."""
    missing = error.name if isinstance(error, ModuleNotFoundError) and error.name else ""
    top = missing.partition(".")[0]
    here = path.resolve().parent
    if top and ((here / f"{top}.py").is_file() or (here / top).is_dir()):
        return (f"{path.name} imports {top!r}, which is beside it in {here}: tinyrl imports {path.name} alone, "
                f"without its directory on the import path (so does export-verl's copy of it); put what it uses "
                f"from {top} into {path.name}, or install {top} as a package (`pip install -e` of its project)")
    return (f"fix the file; `python -P {path}` shows the whole error (-P: without the file's directory on the "
            "import path, as tinyrl imports it)")
