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


@pytest.mark.cluster  # runs pip in a subprocess
def test_the_wheel_provides_only_the_kvplane_import_name(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy2(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(src)],
        check=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("kvplane-*.whl")
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
