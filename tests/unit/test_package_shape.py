"""The package's shape: no import cycle between its modules, no module over 320 lines.

The import graph is read from the source (every `import` and `from ... import`, at module
level or inside a function), so a lazy import that goes back up a chain counts too: each
mechanism lives in one module that the others import, never in a circle. The backend-free
folders receive the active backend through `_backend` (the dispatcher hands itself in),
never importing `backends`, which builds on them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import keras_mgpu_plugins

ROOT = Path(keras_mgpu_plugins.__file__).parent
PACKAGE = "keras_mgpu_plugins"
MAX_LINES = 320

def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name to file."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports, each resolved to the most specific module named."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in modules else base)
    return {t for t in targets if t in modules and t != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One closed path through `component`, to name in the failure."""
    members = set(component)
    start = component[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(graph[path[-1]] & members)
        back = [n for n in nxt if n in seen]
        if back:
            return path[path.index(back[0]):] + [back[0]]
        path.append(nxt[0])
        seen.add(nxt[0])


def test_the_graph_sees_lazy_and_relative_imports():
    graph = _graph()
    assert f"{PACKAGE}.cluster.topology" in graph[f"{PACKAGE}.backends.tensorflow.strategy"]
    assert f"{PACKAGE}._backend" in graph[f"{PACKAGE}.cluster.local_devices"]  # in a function


def test_no_import_cycle():
    graph = _graph()
    cycles = [" -> ".join(_one_cycle(graph, c)) for c in _cycles(graph)]
    assert not cycles, "import cycles in the package:\n" + "\n".join(cycles)


def test_the_cycle_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _one_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_module_over_320_lines():
    long = {str(path.relative_to(ROOT.parent)): n for path in _modules().values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split along a seam): {long}"
