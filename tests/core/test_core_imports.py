"""The routing core stays plain Python: importing it loads no gRPC, store or torch module."""
from __future__ import annotations

import subprocess
import sys

_FORBIDDEN = ("grpc", "etcd3", "aetcd", "torch", "google.protobuf")


def test_core_imports_no_runtime_dependencies():
    probe = (
        "import sys\n"
        "import controlplane.core.index, controlplane.core.router, controlplane.core.admission\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {_FORBIDDEN!r} or m in {_FORBIDDEN!r}))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
