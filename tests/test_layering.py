"""Layering: every import between the project's modules points one way.

Everything is under the one import name `kvplane`. Floors, bottom up, by module prefix (a module
may import its own floor and those below, never above):
- the shared floor: every `kvplane.*` module that is not a plane or an application (types, block
  hashes, tickets, errors, security, grpc_util, telemetry, the `v1` stubs, hardware, the client SDK);
  imports only the shared floor;
- `kvplane.controlplane.core` (the plain-Python planner and its algorithms): the standard library,
  numpy (the fleet's columns, core/pool.py: arithmetic, no I/O) and `kvplane.types`,
  `kvplane.block_hash`, `kvplane._pricing` (the compiled pricing), `kvplane.latency`,
  `kvplane.stats` only (no grpc, store client or torch);
- the planes: `kvplane.controlplane` (its core and the shared floor) and `kvplane.dataplane` (the
  shared floor); neither imports the other: they meet over gRPC;
- the applications, `kvplane.apps` (CLI, benchmarks, sim, local cluster launcher, demo), and
  `python -m kvplane`: anything, except that the benchmarks reach the data plane only through its
  public packages.
Every import counts, function-local and TYPE_CHECKING ones included, and the whole graph has
no cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# import prefix -> folder under the repository root (the planes' folders sit at the top level, setup.py maps them)
SOURCES = {"kvplane": "kvplane", "kvplane.controlplane": "controlplane", "kvplane.dataplane": "dataplane"}
CORE_LIBRARIES = ("numpy",)  # third-party packages the core may use: computation only
CORE = "kvplane.controlplane.core"
PLANES = ("kvplane.controlplane", "kvplane.dataplane")
TOP = ("kvplane.apps", "kvplane.__main__")
CORE_MAY_IMPORT = ("kvplane.types", "kvplane.block_hash", "kvplane._pricing", "kvplane.latency", "kvplane.stats")
# The benchmarks' doors into the data plane: package entry points, not their modules.
BENCH_DATAPLANE_DOORS = tuple(f"kvplane.dataplane.{door}" for door in ("engines", "engines.reference", "engines.sim", "transport"))


def _under(module: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _shared(module: str) -> bool:
    return _under(module, "kvplane") and not _under(module, (*PLANES, *TOP))


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    modules = {}
    for prefix, folder in SOURCES.items():
        for path in [*(root / folder).rglob("*.py"), *(root / folder).rglob("*.c")]:  # .c: compiled modules (kvplane._pricing)
            parts = path.relative_to(root / folder).with_suffix("").parts
            name = ".".join((prefix, *(parts[:-1] if parts[-1] == "__init__" else parts)))
            modules[name] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports (`from pkg import name` counts as importing
    pkg.name when that is a module, else pkg)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        source = path.read_text() if path.suffix == ".py" else ""  # a compiled module's C imports none of ours
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else node.module)
        graph[name] = {t for t in targets if _under(t, "kvplane") and t != name}
    return graph


def floor_violation(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None when it may."""
    if _shared(importer):
        return None if _shared(imported) else "the shared floor imports only shared modules"
    if _under(importer, CORE):
        if _under(imported, (CORE, *CORE_MAY_IMPORT)):
            return None
        return "kvplane.controlplane.core is plain Python: stdlib and kvplane.types/block_hash/_pricing/latency/stats only"
    for plane in PLANES:
        if _under(importer, plane):
            return None if _under(imported, plane) or _shared(imported) else f"{plane} imports itself and the shared floor"
    if _under(importer, "kvplane.apps.bench") and _under(imported, "kvplane.dataplane") and imported not in BENCH_DATAPLANE_DOORS:
        return f"benchmarks use the data plane's public packages {BENCH_DATAPLANE_DOORS}, not its modules"
    return None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _third_party_in_core(modules: dict[str, Path]) -> set[str]:
    out = set()
    for name, path in modules.items():
        if not _under(name, CORE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            )
            out.update(f"{name}: {n}" for n in names if n.split(".")[0] not in (*sys.stdlib_module_names, "kvplane", *CORE_LIBRARIES))
    return out


def test_every_import_points_down_the_floors():
    graph = import_graph(project_modules())
    wrong = sorted(f"{a} -> {b}: {why}" for a, targets in graph.items() for b in targets if (why := floor_violation(a, b)))
    assert wrong == []


def test_the_core_imports_no_third_party_package():
    assert _third_party_in_core(project_modules()) == set()


def test_the_import_graph_has_no_cycle():
    assert find_cycle(import_graph(project_modules())) is None


def test_the_checks_see_wrong_way_imports_and_cycles(tmp_path):
    # A miniature project with each mistake once: the checks must name them.
    for folder, files in {
        "kvplane": {
            "__init__.py": "",
            "types.py": "import kvplane.apps.cli\n",
            "apps/__init__.py": "",
            "apps/cli.py": "import kvplane.types\n",
        },
        "controlplane": {"__init__.py": "", "core/__init__.py": "", "core/router.py": "import grpc\nfrom kvplane.dataplane import agent\n"},
        "dataplane": {"__init__.py": "", "agent.py": "def f():\n    from kvplane.controlplane.core import router\n"},
    }.items():
        for rel, text in files.items():
            (tmp_path / folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / folder / rel).write_text(text)
    modules = project_modules(tmp_path)
    graph = import_graph(modules)
    wrong = {(a, b) for a, targets in graph.items() for b in targets if floor_violation(a, b)}
    assert wrong == {
        ("kvplane.types", "kvplane.apps.cli"),
        ("kvplane.controlplane.core.router", "kvplane.dataplane.agent"),
        ("kvplane.dataplane.agent", "kvplane.controlplane.core.router"),
    }
    assert find_cycle(graph) is not None
    assert _third_party_in_core(modules) == {"kvplane.controlplane.core.router: grpc"}
