"""The built distribution: one import name, `kvplane`, with the planes mapped under it.

Installing kvplane must not add `controlplane` or `dataplane` to site-packages (a `dataplane`
distribution exists on the package index, and a user's own folder of that name would shadow ours).
The wheel is built from a copy of the sources, so the checkout gets no build/ or egg-info.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("kvplane", "controlplane", "dataplane", "setup.py", "pyproject.toml", "README.md")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip builds from a copy of the sources (no build/ or egg-info left in the checkout),
    built once for the tests that read it."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    src = tmp_path / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
        check=True,
        timeout=300,
    )
    (wheel,) = dist.glob("kvplane-*.whl")
    return wheel


@pytest.mark.cluster  # runs pip in a subprocess
def test_the_wheel_provides_only_the_kvplane_import_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"kvplane"}
    for module in (
        "kvplane/controlplane/core/planner.py",
        "kvplane/dataplane/agent/main.py",
        "kvplane/apps/cli/main.py",
        "kvplane/client/sync.py",
        "kvplane/py.typed",
    ):
        assert module in names
    dist_info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "kvplane = kvplane.apps.cli.main:main" in zipfile.ZipFile(wheel).read(dist_info).decode()


BASE = {"grpcio", "protobuf", "opentelemetry-api"}


@pytest.mark.cluster  # runs pip in a subprocess
def test_the_base_install_is_grpc_protobuf_and_the_opentelemetry_api(wheel: Path) -> None:
    from email.parser import Parser  # noqa: PLC0415

    with zipfile.ZipFile(wheel) as z:
        metadata = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    requires = metadata.get_all("Requires-Dist")
    base = {r.split(";")[0].split("=")[0].split(">")[0].split("<")[0].strip() for r in requires if "extra ==" not in r}
    assert base == BASE
    assert {"server", "agent", "reference", "engines", "nixl", "tokenizers", "bench", "test"} <= set(metadata.get_all("Provides-Extra"))


# A process in which every third-party package but the base install's fails to import.
_BASE_ONLY = r"""
import importlib.abc, sys
ALLOWED = {"grpc", "google", "opentelemetry", "typing_extensions", "importlib_metadata", "zipp", "deprecated", "wrapt"}

class BaseOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in ALLOWED or top.startswith("_") or top == "kvplane":
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (not in the base install)", name=name)

sys.meta_path.insert(0, BaseOnly())
import kvplane
kvplane.Client, kvplane.AsyncClient, kvplane.RejectedError
from kvplane.apps.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.cluster  # runs the CLI in a subprocess
@pytest.mark.parametrize(
    ("argv", "exit_code", "stderr"),
    [
        (["workers", "--endpoint", "127.0.0.1:1", "--insecure"], 5, "cannot reach the kvplane control plane"),
        (["wait", "--within", "0.2", "--endpoint", "127.0.0.1:1", "--insecure"], 5, "not ready after 0.2 s"),
        (["certs", "ca", "--dir", "{tmp}"], 2, "kvplane certs needs the package 'cryptography'"),
        (["controlplane", "--insecure"], 2, "pip install 'kvplane[server]'"),
        (["agent", "--insecure"], 2, "pip install 'kvplane[agent,reference]'"),
    ],
)
def test_the_sdk_and_client_commands_run_on_the_base_install_and_the_rest_name_their_extra(tmp_path, argv, exit_code, stderr) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    result = subprocess.run([sys.executable, "-c", _BASE_ONLY, *argv], capture_output=True, text=True, timeout=60)
    assert result.returncode == exit_code, result.stderr
    assert stderr in result.stderr and "Traceback" not in result.stderr
