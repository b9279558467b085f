"""No import cycles inside controlplane/core: every import between its modules, function-local
and TYPE_CHECKING ones included, points one way (views -> routing -> policies -> router ->
planner; admission_base -> policies -> admission registry)."""
from __future__ import annotations

import ast
from pathlib import Path

import controlplane.core

_CORE_DIR = Path(controlplane.core.__file__).parent
_PACKAGE = "controlplane.core"


def _module_name(path: Path) -> str:
    parts = path.relative_to(_CORE_DIR).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((_PACKAGE, *parts))


def core_import_graph() -> dict[str, set[str]]:
    """module -> the core modules it imports (`from pkg import name` counts as importing
    pkg.name when that is a module, else pkg)."""
    modules = {_module_name(p): p for p in _CORE_DIR.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module for alias in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_controlplane_core_has_no_import_cycle():
    cycle = find_cycle(core_import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_sees_core_imports_and_cycles():
    graph = core_import_graph()
    assert "controlplane.core.policies" in graph["controlplane.core.router"]
    assert "controlplane.core.policies.kvplane" in graph["controlplane.core.policies"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
