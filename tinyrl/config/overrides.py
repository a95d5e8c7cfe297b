"""Putting values onto a Config: a preset file's sections and `--set key.sub=value` items, each
checked against the field's type, with a did-you-mean for unknown keys.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from dataclasses import fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

from tinyrl.config.schema import Config


# Keys that moved to the task section (issue 13): old presets get a pointer, old runs are migrated.
MOVED = {"data.template": "task.template", "reward.format_score": "task.format_score",
         "reward.strict": "task.strict"}


def _migrate(raw: dict) -> dict:
    """A config.json written before the task section: move its keys to their new homes."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for old, new in MOVED.items():
        section, key = old.split(".")
        if isinstance(raw.get(section), dict) and key in raw[section]:
            raw.setdefault("task", {}).setdefault(new.split(".")[1], raw[section].pop(key))
    return raw


def _apply_dict(obj: Any, raw: dict, prefix: str) -> list[str]:
    problems = []
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in _field_names(obj):
            problems.append(_unknown_key(obj, key, dotted))
            continue
        current = getattr(obj, key)
        if is_dataclass(current):
            if not isinstance(value, dict):
                problems.append(f"{dotted} is a section; write [{dotted}] with keys under it")
            else:
                problems += _apply_dict(current, value, prefix=dotted + ".")
            continue
        problem = _set_typed(obj, key, value, dotted)
        if problem:
            problems.append(problem)
    return problems


def _apply_override(cfg: Config, item: str) -> list[str]:
    if "=" not in item:
        return [f"--set {item!r} is not key=value (example: --set actor.lr=1e-6)"]
    dotted, text = item.split("=", 1)
    dotted = dotted.strip()
    obj: Any = cfg
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if part not in _field_names(obj):
            return [_unknown_key(obj, part, ".".join(parts[: depth + 1]))]
        if depth < len(parts) - 1:
            obj = getattr(obj, part)
            if not is_dataclass(obj):
                return [f"{'.'.join(parts[:depth + 1])} is a value, not a section"]
    if is_dataclass(getattr(obj, parts[-1])):
        keys = ", ".join(f"{dotted}.{k}" for k in _field_names(getattr(obj, parts[-1])))
        return [f"{dotted} is a section; set one of its keys: {keys}"]
    problem = _set_typed(obj, parts[-1], _parse_value(text.strip()), dotted)
    return [problem] if problem else []


def set_key(item: str) -> str:
    """The dotted key of a --set item: 'actor.lr=1e-6' -> 'actor.lr'."""
    return item.split("=", 1)[0].strip()


class TypedSets(list):
    """--set items as the user typed them (the CLI's --set option): a key given twice is a problem
    load_config says with the others. A program's own list (a test's, the doctor's layered one)
    is a plain list, whose last item for a key wins."""


def apply_overrides(cfg: Config, overrides: list[str] | None) -> list[str]:
    """--set items onto `cfg` -> their problems. A key the user typed twice (TypedSets): which
    value was meant is not ours to guess, so neither is applied or judged, and it is said with
    the config's other problems (it was refused alone, hiding them, until 2026-11-28)."""
    typed = overrides if isinstance(overrides, TypedSets) else []
    problems = [f"{line}: give it once, with the value you mean" for line in repeated_sets(typed)]
    keys = [set_key(item) for item in typed]
    twice = {key for key in keys if keys.count(key) > 1}
    for item in overrides or []:
        problems += _apply_override(cfg, item) if set_key(item) not in twice | {"preset"} else []
    return problems


def repeated_sets(items: list[str]) -> list[str]:
    """One line per key that a --set list gives more than once, naming every value. The CLI
    refuses them (which one did the user mean?) instead of letting the last win: the config
    check used to report a problem for each value, as if both were set."""
    by_key: dict[str, list[str]] = {}
    for item in items:
        by_key.setdefault(set_key(item), []).append(item.strip())
    return [f"{key} is given {len(values)} times: " + ", ".join(f"--set {v}" for v in values)
            for key, values in by_key.items() if len(values) > 1]


def layered(user: list[str] | None, own: list[str]) -> list[str]:
    """A program's settings on top of a user's --set list (the doctor's small batch): the
    user's items for a key that `own` sets are dropped, so a command line built from the
    result names each key once, and the program's value is the one that runs."""
    mine = {set_key(item) for item in own}
    return [item for item in user or [] if set_key(item) not in mine] + list(own)


def _parse_value(text: str) -> Any:
    """TOML literal when it parses (1e-6, true, [1, 2], "x"), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _field_names(obj: Any) -> list[str]:
    return [f.name for f in fields(obj)]


def _unknown_key(obj: Any, key: str, dotted: str) -> str:
    if dotted in MOVED:
        return f"{dotted} moved to {MOVED[dotted]} (the task section); write it there"
    prefix = dotted[: -len(key)]
    near = difflib.get_close_matches(key, _field_names(obj), n=1, cutoff=0.5)
    # a section's key given without its section (`max_steps=3`): listing the sections did not say which
    within = [f"{f.name}.{key}" for f in fields(obj) if is_dataclass(getattr(obj, f.name))
              and key in _field_names(getattr(obj, f.name))]
    hint = (f"did you mean {prefix}{near[0]}?" if near else f"did you mean {' or '.join(prefix + w for w in within)}?"
            if within else f"valid keys: {', '.join(prefix + n for n in _field_names(obj))}")
    return f"unknown key {dotted!r}; {hint}"


def _set_typed(obj: Any, key: str, value: Any, dotted: str) -> str | None:
    expected = get_type_hints(type(obj))[key]
    current = getattr(obj, key)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if get_origin(expected) is list:  # each element too: [1, 2] as reward functions crashed later
        (element,) = get_args(expected)
        if not isinstance(value, list):
            return f"{dotted} must be a list of {element.__name__}, got {value!r}{_as_list_hint(dotted, value)}"
        if element is float:
            value = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        wrong = [v for v in value if not isinstance(v, element) or isinstance(v, bool)]
        if wrong:
            return f"{dotted} must be a list of {element.__name__}, got {value!r} ({wrong[0]!r} is not)"
        setattr(obj, key, value)
        return None
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, float),
        str: isinstance(value, str),
    }.get(expected, isinstance(value, type(current)))
    if not ok:
        quoted = isinstance(value, str) and expected in (int, float, bool) and isinstance(_parse_value(value), expected)
        unquote = f" (quoted, it is text: write {key} = {value} without the quotes)" if quoted else ""
        return f"{dotted} must be {getattr(expected, '__name__', str(expected))}, got {value!r}{unquote}"
    setattr(obj, key, value)
    return None


def _as_list_hint(dotted: str, value: Any) -> str:
    """How to write the list that a single value (or "a,b" text) was given for."""
    if isinstance(value, str):  # `[a.py:f]` unquoted in a shell is text too: its brackets are not the item's
        inner = value.strip()
        inner = inner[1:-1] if inner.startswith("[") and inner.endswith("]") else inner
        items = [v.strip().strip("'\"") for v in inner.split(",") if v.strip().strip("'\"")]
    else:
        items = [value]
    text = json.dumps(items)  # a JSON list of strings or numbers is a TOML list too
    return f"; write {dotted.rsplit('.', 1)[-1]} = {text} (with --set: '{dotted}={text}')"
