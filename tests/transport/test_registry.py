"""The transport registry: preference order, construction by name, and NIXL's absence."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvplane.dataplane.transport import (
    available_transports,
    make_transport,
    unavailable_reason,
)
from kvplane.dataplane.transport.grpc_stream import GrpcStreamTransport

from .kv_peer import LAYOUT, empty_pool

HAVE_NIXL = importlib.util.find_spec("nixl") is not None
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not HAVE_NIXL, reason="the nixl package is not installed (pip install 'kvplane[nixl]')")
def test_nixl_comes_first_when_it_works():
    assert available_transports() == ["nixl", "grpc"]
    assert unavailable_reason("nixl") is None


@pytest.mark.skipif(not HAVE_NIXL, reason="the nixl package is not installed (pip install 'kvplane[nixl]')")
def test_make_nixl_derives_a_unique_agent_name_from_the_worker():
    first = make_transport("nixl", empty_pool(LAYOUT, 2), agent_name="worker-a")
    second = make_transport("nixl", empty_pool(LAYOUT, 2), agent_name="worker-a")
    try:
        assert first.name == "nixl"
        assert first.agent_name.startswith(f"worker-a-{os.getpid()}-")
        assert first.agent_name != second.agent_name
    finally:
        first.close()
        second.close()


def test_make_grpc_passes_options():
    transport = make_transport("grpc", empty_pool(LAYOUT, 2), agent_name="ignored", chunk_bytes=4096)
    assert isinstance(transport, GrpcStreamTransport)
    assert (transport.name, transport._chunk_bytes) == ("grpc", 4096)


def test_unknown_transport_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown KV transport 'rdma'; known transports: \['nixl', 'grpc'\]"):
        make_transport("rdma", empty_pool(LAYOUT, 2))


@pytest.mark.cluster
def test_without_nixl_only_grpc_is_offered_and_nixl_is_refused_clearly():
    """A real process in which `import nixl` fails, as on a machine without the package."""
    code = (
        "import sys; sys.modules['nixl'] = None\n"
        "from dataplane.transport import available_transports, make_transport, TransportUnavailableError\n"
        "from tests.transport.kv_peer import LAYOUT, empty_pool\n"
        "print(available_transports())\n"
        "try:\n"
        "    make_transport('nixl', empty_pool(LAYOUT, 2))\n"
        "except TransportUnavailableError as e:\n"
        "    print(e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "['grpc']"
    assert lines[1].startswith(
        "KV transport 'nixl' is not available here: the nixl transport needs the nixl package "
        "(pip install 'kvplane[nixl]'); importing it failed: "
    )
