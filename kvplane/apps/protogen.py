"""Regenerates the checked-in Python stubs from protos/ (python -m kvplane.apps.protogen)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
PROTO_DIR = ROOT / "protos"


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.rglob("*.proto"))


def generate(out_dir: Path) -> None:
    # protoc runs in its own process: in-process it can crash a host that loaded torch or nixl.
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        sys.executable, "-m", "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_DIR)) for p in proto_files()],
    ]  # fmt: skip
    result = subprocess.run(args, cwd=PROTO_DIR, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"protoc failed: {result.stderr.strip()}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
