"""Turn a reward spec from the config into `fn(completion, example) -> float`.

Specs: a builtin name ("countdown"), `path/to/file.py:func`, or a dotted `module:func`.
`example` is one dataset row (TinyZero schema) as a dict or pandas Series. User functions run
in a worker process (tinyrl.rewards.worker: one that ends the process, e.g. os._exit, cannot end
the run quietly) and are wrapped so that a crash (SystemExit included), a non-number return
(True included), a non-finite or absurd one (|r| > MAX_ABS_REWARD) or a call longer than
reward.timeout_s (tinyrl.rewards.limits) becomes a TinyRLError naming the function and the sample.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import inspect
import math
import numbers
from pathlib import Path
from typing import Any, Callable

from tinyrl.errors import TinyRLError
from tinyrl.pyfile import import_failure_hint, import_file
from tinyrl.rewards import limits

RewardFn = Callable[[str, Any], float]
# A reward beyond this is a bug, not a score: 1e308 made the advantages inf and every optimizer
# step was skipped while the run "finished" (issue 29). Rewards in RL are O(1); shaping sums
# stay far below a million.
MAX_ABS_REWARD = 1e6
_SPEC_HINT = "set the reward to a builtin name, `path/to/file.py:func` or `module:func`"


def _countdown(format_score: float, strict: bool) -> RewardFn:
    from tinyrl.tasks.countdown import reward  # the task owns its reward (tinyrl/tasks/)

    return reward(format_score, strict)


# name -> factory(format_score, strict): the legacy spelling of `task.name` + `reward.fn = "task"`.
BUILTIN_REWARDS: dict[str, Callable[[float, bool], RewardFn]] = {"countdown": _countdown}


def _load_file(path_str: str) -> Any:
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise TinyRLError(f"reward file not found: {path}",
                          hint=f"check the path (relative paths start at {Path.cwd()}); {_SPEC_HINT}")
    try:
        module = import_file(path, "tinyrl_user_reward")
    except (Exception, SystemExit) as e:  # any error in the user's module body is theirs to fix
        raise TinyRLError(f"importing reward file {path} failed: {type(e).__name__}: {e}",
                          hint=import_failure_hint(path, e)) from e
    if module is None:
        raise TinyRLError(f"cannot import reward file {path}", hint="it must be a .py file")
    return module


def _load_module(name: str, func_name: str = "func") -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise TinyRLError(f"cannot import reward module {name!r}: {e}",
                          hint=f"{file_here_hint(name, func_name)}install it or put it on PYTHONPATH; {_SPEC_HINT}") from e
    except (Exception, SystemExit) as e:  # its body failed: the user's to fix, as in _load_file
        raise TinyRLError(f"importing reward module {name!r} failed: {type(e).__name__}: {e}",
                          hint=f"fix the module; run `python -c 'import {name}'` to see the full error") from e


def describe_sample(completion: str, example: Any) -> str:
    """The sample a reward call was given, short: the row's index if it has one, the completion."""
    where = ""
    try:
        info = example["extra_info"]
        where = f"row index {info['index']} ({info.get('split', '?')}), " if info is not None else ""
    except (KeyError, TypeError, IndexError):
        pass
    return f"{where}completion {completion[:120]!r}" + ("..." if len(completion) > 120 else "")


def _wrap(fn: Callable, label: str, timeout_s: float) -> RewardFn:
    """`fn` under the time limit, its errors and bad values as TinyRLErrors naming it and the
    sample; `episode` reaches it only when it takes one (reads_episode)."""
    wants_episode = reads_episode(fn)

    def reward(completion: str, example: Any, episode: Any = None) -> float:
        sample = lambda: describe_sample(completion, example)  # noqa: E731
        what = lambda: f"reward function {label} on {sample()}"  # noqa: E731
        try:
            with limits.time_limit(timeout_s) as elapsed:
                value = fn(completion, example, episode=episode) if wants_episode else fn(completion, example)
            if elapsed() > timeout_s:  # it swallowed the alarm (a bare except) and returned late
                raise limits.RewardTimeout()
        except limits.RewardTimeout:
            raise TinyRLError(f"{what()} did not return within reward.timeout_s = {timeout_s:g} s",
                              hint=f"fix {label} (an endless loop?) or raise reward.timeout_s") from None
        # SystemExit and KeyboardInterrupt from inside the function are its bugs, not a request to
        # stop tinyrl (a real Ctrl-C is handled by tinyrl.interrupts and never reaches here as one).
        except (Exception, SystemExit, KeyboardInterrupt) as e:
            raise TinyRLError(f"{what()} raised {type(e).__name__}: {e}",
                              hint=f"fix {label}; call it on that row to reproduce") from e
        # bool is an int in Python, but True is not a score: a forgotten `return x == y` is a bug.
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not _finite(value):
            raise TinyRLError(
                f"reward function {label} returned {value!r:.100} ({type(value).__name__}), "
                f"not a finite number, on {sample()}",
                hint=f"make {label} return a float, e.g. 1.0 for a correct completion")
        if abs(value) > MAX_ABS_REWARD:
            raise TinyRLError(
                f"reward function {label} returned {_magnitude(value)}, beyond the bound of +-{MAX_ABS_REWARD:g} "
                f"tinyrl accepts, on {sample()}; a reward that large overflows the advantages",
                hint=f"make {label} return rewards of order 1 (scale them down)")
        return float(value)
    return reward


def _finite(value: numbers.Real) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past float's range (10**400) is finite: the bound below says it
        return True


def _magnitude(value: numbers.Real) -> str:
    try:
        return f"{float(value):g}"
    except OverflowError:
        return f"an integer of {int(value).bit_length()} bits"


def reads_episode(fn: Callable) -> bool:
    """Whether a reward takes an `episode` keyword (then it gets the sample's Episode)."""
    try:
        return "episode" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable without a signature (a builtin, a C extension)
        return False


def check_call_shape(fn: Callable, spec: str) -> None:
    """The user's function can be called as the trainer calls it: said when it loads, before any
    model, not at the first reward of step 1."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # nothing to check against: its first call says what is wrong
    name = getattr(fn, "__name__", spec.rpartition(":")[2])  # a callable object has no __name__
    try:
        signature.bind("", {}, **({"episode": None} if "episode" in signature.parameters else {}))
    except TypeError as e:
        raise TinyRLError(f"reward function {spec} cannot be called as {name}(completion, example): {e}",
                          hint="define it as `def func(completion: str, example: dict) -> float`, with an "
                               "`episode=None` keyword if it reads the sample's turns and tool calls") from None


def load_reward_fn(spec: str, format_score: float = 0.1, strict: bool = False, timeout_s: float = 60.0,
                   prints_to: Path | None = None) -> RewardFn:
    """Resolve `spec`; `format_score` and `strict` apply to builtin rewards only. A user's
    function is loaded (and its import errors reported) in its worker process; what it prints
    goes to `prints_to` (None: stderr; tinyrl.rewards.worker)."""
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec](format_score, strict)
    _split(spec)
    from tinyrl.rewards.worker import WorkerReward

    return WorkerReward(spec, timeout_s, prints_to)


def parse_spec(spec: str) -> tuple[str, str, bool] | None:
    """(target, function name, whether target is a file) of `path/to/file.py:func` or
    `module:func`; None when the spec has neither shape."""
    target, sep, func_name = spec.rpartition(":")  # rpartition: "C:\\x.py:f" keeps the drive
    if not sep or not target or not func_name:
        return None
    return target, func_name, target.endswith(".py") or "/" in target or "\\" in target


def _split(spec: str) -> tuple[str, str, bool]:
    parsed = parse_spec(spec)
    if parsed is None:
        raise TinyRLError(f"unknown reward {spec!r}",
                          hint=f"builtin rewards: {', '.join(BUILTIN_REWARDS)}; or {_SPEC_HINT}")
    return parsed


# A module that binds names at run time (a module __getattr__, exec, globals()[...], a star
# import) can define the function without a statement a reader sees: only its import can tell.
_DYNAMIC = {"__getattr__", "exec", "globals", "vars", "setattr", "__dict__"}


def missing_function(path: Path, func_name: str) -> str | None:
    """What is wrong with `path`'s `func_name`, read from the file's text without running it (the
    config check runs before any model loads; the import itself happens in the reward worker):
    a syntax error, or no top-level statement binding that name. None: it looks there."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as e:
        return f"{path} has a SyntaxError at line {e.lineno}: {e.msg}"
    except (OSError, ValueError):  # unreadable, or NUL bytes: its import says what is wrong
        return None
    bound, functions = _module_names(tree)
    if bound is None or func_name in bound:
        return None
    near = difflib.get_close_matches(func_name, sorted(bound), n=1)
    guess = f" (did you mean {near[0]!r}?)" if near else ""
    return (f"{path} defines no function {func_name!r}{guess}; "
            f"its functions: {', '.join(functions) or 'none'}")


def module_file(target: str) -> Path:
    """The file a `module:func` spec's module would be, relative to here: a.b -> a/b.py."""
    return Path(*target.split(".")).with_suffix(".py")


def file_here_hint(target: str, func_name: str) -> str:
    """'a file here? ...' when `module:func` names a module that is a .py file in the working
    directory (module:func imports by name, and the working directory is not on the path)."""
    path = module_file(target)
    return f"{path} is a file here: give reward.fn={path}:{func_name}; " if path.is_file() else ""


def module_problem(target: str, func_name: str) -> str | None:
    """What is wrong with a `module:func` spec's module, found without importing it (its top-level
    package is looked up, not run): None when it can be imported (its import may still fail: the
    reward worker says how)."""
    top = target.partition(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    here = module_file(target)
    if here.is_file():
        return (f"no module {top!r} can be imported (module:func imports by name, from the installed packages and "
                f"PYTHONPATH, not the working directory); {here} is a file here: give {here}:{func_name}")
    return (f"no module {top!r} can be imported (module:func imports by name, from the installed packages and "
            "PYTHONPATH); for a file of yours give path/to/file.py:func")


def not_a_function(path: Path, func_name: str) -> str | None:
    """`func_name` bound in `path` only to literals (`score = 3`, a string, a list): what it is,
    read from the file's text; None when it may be a function (a def, an import, anything else)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, OSError, ValueError):
        return None  # missing_function says it
    literal_targets, values = set(), []
    for node in _outside_functions(tree.body):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) for t in targets) and any(t.id == func_name for t in targets):
                try:
                    values.append(ast.literal_eval(node.value))
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    return None  # a call, a name, a lambda: perhaps callable
                literal_targets.update(id(t) for t in targets)
    if not values:
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == func_name
                and id(node) not in literal_targets) or _name_of(node) == func_name and not isinstance(node, ast.Name) \
                or isinstance(node, ast.Global) and func_name in node.names \
                or isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                    (a.asname or a.name).partition(".")[0] == func_name for a in node.names):
            return None
    value = values[-1]
    return (f"{path}'s {func_name} is {value!r:.40} ({type(value).__name__}), not a function; the reward is "
            f"`def {func_name}(completion, example) -> float`")


def _module_names(tree: ast.Module) -> tuple[set[str] | None, list[str]]:
    """(every name the module binds at its top level, or None when it may bind more at run time;
    its public top-level functions, in file order)."""
    bound: set[str] = set()
    functions: list[str] = []
    for node in _outside_functions(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            if not isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                functions.append(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None, functions
            bound.update((alias.asname or alias.name).partition(".")[0] for alias in node.names)
    for node in ast.walk(tree):  # a function's `global x` binds x too
        if isinstance(node, ast.Global):
            bound.update(node.names)
        elif _name_of(node) in _DYNAMIC:
            return None, functions
    return bound, functions


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return getattr(node, "name", None)  # a def or class; an import alias's name is a dotted path


def _outside_functions(nodes: list[ast.AST]):
    """The statements and expressions of the module's own scope (not inside a def or class body)."""
    for node in nodes:
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield from _outside_functions(list(ast.iter_child_nodes(node)))


def resolve_user_fn(spec: str) -> Callable:
    """The user's function itself (in the reward worker: tinyrl.rewards.worker)."""
    target, func_name, is_file = _split(spec)
    module = _load_file(target) if is_file else _load_module(target, func_name)
    fn = getattr(module, func_name, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise TinyRLError(f"{target} has no function {func_name!r}",
                          hint=f"callables there: {', '.join(public) or 'none'}; {_SPEC_HINT}")
    if not callable(fn):
        raise TinyRLError(f"{spec} is not a function: it is {fn!r:.60} ({type(fn).__name__})",
                          hint="point the reward at `def func(completion: str, example: dict) -> float`")
    return fn
