"""The routing core stays plain Python: its modules import only the standard library,
kvplane.types, kvplane.block_hash and each other (no gRPC, store client or torch)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import controlplane.core

_CORE_DIR = Path(controlplane.core.__file__).parent
_ALLOWED_PROJECT_MODULES = {"kvplane.types", "kvplane.block_hash", "kvplane.latency"}


def _imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def test_core_modules_import_only_stdlib_and_shared_types():
    offenders = {
        f"{path.name}: {module}"
        for path in sorted(_CORE_DIR.rglob("*.py"))
        for module in _imported_modules(path)
        if module.split(".")[0] not in sys.stdlib_module_names
        and module not in _ALLOWED_PROJECT_MODULES
        and not module.startswith("controlplane.core")
    }
    assert offenders == set()


def test_the_import_check_sees_core_imports():
    assert {"kvplane.types", "controlplane.core.index"} <= _imported_modules(_CORE_DIR / "router.py")
