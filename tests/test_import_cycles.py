"""No import cycles among tinyrl's modules at module level (DESIGN: "no import cycles").

A function-level import (`from tinyrl.tasks import ...  # local: ...`) runs when called, after
every module has loaded, so only top-level imports count. A cycle there works until the day an
import order changes, then fails with a half-initialised module.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tinyrl"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def top_level_imports(path: Path, known: set[str]) -> set[str]:
    """The tinyrl modules `path` imports at module level: `from tinyrl.a import b` is tinyrl.a.b
    when that is a module, else tinyrl.a."""
    deps = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tinyrl"):
            deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names}
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name.startswith("tinyrl")}
    return deps & known


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: top_level_imports(p, set(paths)) - {name} for name, p in paths.items()}


def cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path start -> ... -> start, if there is one (depth-first)."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for dep in sorted(graph[node]):
            if dep == start:
                return path + [start]
            if dep not in seen:
                seen.add(dep)
                stack.append((dep, path + [dep]))
    return None


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycle_from(graph, "a") == ["a", "b", "c", "a"] and cycle_from(graph, "d") is None


def test_the_graph_is_read():
    graph = import_graph()
    assert "tinyrl.config.schema" in graph["tinyrl.config.load"]  # from tinyrl.config.schema import Config
    assert "tinyrl.errors" in graph["tinyrl.cli"]


def test_no_module_level_import_cycles():
    graph = import_graph()
    cycles = [" -> ".join(c) for name in sorted(graph) if (c := cycle_from(graph, name))]
    assert not cycles, "import cycles (move one import into the function that needs it):\n" + "\n".join(cycles)
