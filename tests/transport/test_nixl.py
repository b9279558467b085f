"""NIXL transport: READs from a real peer process's registered pool (UCX, DRAM to DRAM)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

pytest.importorskip("nixl", reason="the nixl package is not installed (pip install 'kvplane[nixl]')")

from kvplane.dataplane.transport import LayoutMismatchError, PullSource, TransferError, TransportError  # noqa: E402
from kvplane.dataplane.transport.nixl import NixlTransport, merge_runs  # noqa: E402
from kvplane.dataplane.transport.nixl_descriptor import NixlDescriptor  # noqa: E402

from .kv_peer import LAYOUT, assert_pulled, empty_pool, start_peer  # noqa: E402

BLOCK_NBYTES = LAYOUT.block_nbytes


@pytest.fixture(scope="module")
def local_transport():
    """The decode side: one NIXL agent over a 16-block pool, shared by this module's tests."""
    pool = empty_pool(LAYOUT, num_blocks=16)
    transport = NixlTransport(pool, agent_name="decode-test")
    yield transport
    transport.close()


@pytest.fixture
def local(local_transport):
    local_transport._pool.buffer.zero_()
    return local_transport._pool


def source_for(peer, layout=LAYOUT) -> PullSource:
    return PullSource(endpoint=peer.endpoint, transfer_id="t0", descriptor=peer.descriptor, layout=layout)


def test_pull_reads_a_non_contiguous_selection_into_other_block_ids(nixl_peer, local_transport, local):
    src, dst = [5, 1, 2, 3, 0], [0, 8, 9, 10, 2]  # indices 1..3 are blocks 3,4,5: one merged read
    moved = asyncio.run(local_transport.pull(source_for(nixl_peer), src, dst))
    assert moved == 5 * BLOCK_NBYTES
    assert_pulled(local, nixl_peer, src, dst)


def test_pull_loads_each_peer_once(nixl_peer, local_transport, local):
    async def run():
        await local_transport.pull(source_for(nixl_peer), [4], [15])
        await local_transport.pull(source_for(nixl_peer), [0], [3])

    asyncio.run(run())
    assert local_transport.num_remote_agents == 1
    assert_pulled(local, nixl_peer, [4, 0], [15, 3])


def test_descriptor_names_the_peer_agent_and_its_pinned_blocks(nixl_peer):
    descriptor = NixlDescriptor.decode(nixl_peer.descriptor)
    assert descriptor.agent_name == nixl_peer.info["agent_name"]
    assert descriptor.agent_name.startswith("kv-peer-")
    assert (descriptor.layout, descriptor.mem_type, descriptor.num_blocks) == (LAYOUT, "DRAM", 6)
    base = int(descriptor.blocks[0, 0]) - 7 * BLOCK_NBYTES  # pinned[0] is block 7
    assert descriptor.blocks.tolist() == [[base + b * BLOCK_NBYTES, BLOCK_NBYTES, 0] for b in nixl_peer.pinned]
    assert nixl_peer.info["startup_s"] > 0


def test_describe_refuses_block_ids_outside_the_pool(local_transport):
    with pytest.raises(ValueError, match=r"block ids \[16\] are outside the pool \(0..15\)"):
        local_transport.describe([0, 16])


def test_pull_refuses_a_layout_that_differs(nixl_peer, local_transport):
    other = dataclasses.replace(LAYOUT, num_layers=3)
    with pytest.raises(LayoutMismatchError) as info:
        asyncio.run(local_transport.pull(source_for(nixl_peer, layout=other), [0], [0]))
    assert str(info.value) == "KV layout mismatch on num_layers: this side has 2, peer has 3"


def test_pull_refuses_a_descriptor_whose_layout_differs(nixl_peer, local_transport):
    real = NixlDescriptor.decode(nixl_peer.descriptor)
    forged = dataclasses.replace(real, layout=dataclasses.replace(LAYOUT, block_size=8)).encode()
    source = PullSource(nixl_peer.endpoint, "t0", forged, LAYOUT)
    with pytest.raises(LayoutMismatchError) as info:
        asyncio.run(local_transport.pull(source, [0], [0]))
    assert str(info.value) == "KV layout mismatch on block_size: this side has 4, peer has 8"


def test_pull_refuses_source_indices_outside_the_transfer(nixl_peer, local_transport):
    with pytest.raises(ValueError, match=r"source block indices \[6\] are outside the transfer's 6 blocks"):
        asyncio.run(local_transport.pull(source_for(nixl_peer), [6], [0]))


def test_nixl_errors_are_reported_as_transfer_errors(nixl_peer, local_transport, local):
    """A descriptor pointing outside the peer's registered memory: NIXL refuses, we say where."""
    real = NixlDescriptor.decode(nixl_peer.descriptor)
    blocks = real.blocks.copy()
    blocks[0, 0] += np.uint64(1 << 40)
    forged = dataclasses.replace(real, blocks=blocks).encode()
    with pytest.raises(
        TransferError,
        match=r"NIXL READ of transfer t0 from kv-peer-\S+ at nixl-peer: nixlNotFoundError: .*not in memory the peer registered",
    ):
        asyncio.run(local_transport.pull(PullSource(nixl_peer.endpoint, "t0", forged, LAYOUT), [0], [0]))
    assert int(local.buffer.count_nonzero()) == 0


@pytest.mark.cluster
def test_pull_from_a_dead_peer_fails_instead_of_hanging(local_transport, local):
    # Depending on how far UCX gets, connecting (backend error) or posting (disconnect) fails.
    peer = start_peer("nixl", 4, 99, [2, 0])
    peer.process.kill()
    peer.stop()
    with pytest.raises(
        TransferError, match=r"NIXL READ of transfer t0 from kv-peer-\S+ at nixl-peer: (nixlBackendError|nixlRemoteDisconnectError): "
    ):
        asyncio.run(local_transport.pull(PullSource(peer.endpoint, "t0", peer.descriptor, LAYOUT), [0, 1], [5, 6]))


def test_merge_runs_joins_blocks_adjacent_on_both_sides():
    local = np.array([[1000, 10, 0], [1010, 10, 0], [1020, 10, 0], [2000, 10, 0]], dtype=np.uint64)
    remote = np.array([[500, 10, 0], [510, 10, 0], [900, 10, 0], [910, 10, 0]], dtype=np.uint64)
    merged_local, merged_remote = merge_runs(local, remote)
    assert merged_local.tolist() == [[1000, 20, 0], [1020, 10, 0], [2000, 10, 0]]
    assert merged_remote.tolist() == [[500, 20, 0], [900, 10, 0], [910, 10, 0]]


def test_closed_transport_refuses_to_pull(nixl_peer):
    transport = NixlTransport(empty_pool(LAYOUT, 2), agent_name="closing")
    transport.close()
    transport.close()  # idempotent
    with pytest.raises(TransportError, match="the nixl transport is closed"):
        asyncio.run(transport.pull(source_for(nixl_peer), [0], [0]))


# The child makes a UCX agent, lists the RDMA libraries it mapped, and exits normally.
_EXIT_CHILD = """
import sys
from tests.transport.kv_peer import LAYOUT, empty_pool
from kvplane.dataplane.transport.nixl import NixlTransport
transport = NixlTransport(empty_pool(LAYOUT, num_blocks=4), agent_name="exit-test")
libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "verbs" in line or "libnl" in line})
print("\\n".join(libs), flush=True)
transport.close()
"""


@pytest.mark.cluster
def test_a_process_with_a_ucx_agent_exits_cleanly_beside_the_system_rdma_libraries():
    """On a host with the RDMA userspace libraries (`make rdma` installs them for this suite), a
    second rdma-core (the system's, beside the wheel's bundled one) crashed every such process
    at exit (SIGSEGV in libnl-route's destructor). The transport keeps the system copy out."""
    import ctypes
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    child = subprocess.run([sys.executable, "-c", _EXIT_CHILD], cwd=root, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, f"exit code {child.returncode}; stderr tail:\n{child.stderr[-2000:]}"
    mapped = child.stdout.split()
    assert all(".libs/" in path for path in mapped), f"a system rdma-core library was loaded beside the bundled one: {mapped}"
    try:
        ctypes.CDLL("libefa.so.1")  # what pulled the system rdma-core in (ibverbs-providers)
    except OSError:
        pytest.skip("passed, but without the system RDMA libraries it proves little: run `make rdma`")


def test_an_idle_transport_leaves_the_cores_alone(local_transport):
    """NIXL's Python wrapper makes its progress thread poll without waiting: a whole core per
    agent, idle or not (every reference-engine agent of a fleet, and of this suite). The
    transport makes it wait for UCX events between polls (PROGRESS_DELAY_US)."""
    import resource
    import time

    def cpu_s() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    before, started = cpu_s(), time.monotonic()
    time.sleep(1.0)
    cores = (cpu_s() - before) / (time.monotonic() - started)
    assert cores < 0.25, f"this process (one idle NIXL agent, the test asleep) used {cores:.2f} cores"


def test_a_negative_progress_delay_is_refused():
    with pytest.raises(ValueError, match="progress_delay_us must be >= 0"):
        NixlTransport(empty_pool(LAYOUT, num_blocks=4), progress_delay_us=-1)
