"""CLI tests run `python -m kvplane` as a real subprocess.

Tests marked `cluster` start real control planes and agents (minutes of CPU on a small
machine); they skip themselves when the server modules are not in the checkout.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sdk.scripted_server import ScriptedServer

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_MODULES = ("kvplane.controlplane.main", "kvplane.dataplane.agent.main", "kvplane.dataplane.transport", "kvplane.dataplane.engines")


def missing_server_modules() -> list[str]:
    missing = []
    for name in SERVER_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except ModuleNotFoundError:
            missing.append(name)
    return missing


def run_kvplane(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
                stdin: str | None = None, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:  # fmt: skip
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "kvplane", *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, input=stdin, cwd=cwd,
    )  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    scripted = ScriptedServer().start()
    yield scripted
    scripted.stop()
