"""KV event sequence gaps: a replica that finds one (a batch number skipped, or a load report
naming a batch it never got) asks the worker for a snapshot through the store, and a snapshot
clears the request. The embedded memory store and a real ClusterState; no processes."""

from __future__ import annotations

import asyncio

from kvplane.controlplane import keys
from kvplane.controlplane.cluster_state import ClusterState
from kvplane.controlplane.store import MemoryStore
from kvplane.types import Tier, WorkerId
from kvplane.v1 import common_pb2, registry_pb2

W = "w"


def _batch(seq: int, hashes: list[bytes], snapshot: bool = False) -> bytes:
    event = common_pb2.KVEvent(stored=common_pb2.BlockStored(block_hashes=hashes, tier=common_pb2.TIER_DEVICE))
    return registry_pb2.PublishKVEventsRequest(worker_id=W, seq=seq, events=[event], snapshot=snapshot).SerializeToString()


def _report(kv_seq: int) -> bytes:
    return registry_pb2.ReportLoadRequest(worker_id=W, load=common_pb2.WorkerLoad(), kv_seq=kv_seq).SerializeToString()


async def _settle(state: ClusterState, predicate, what: str) -> None:
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _device_blocks(state: ClusterState) -> int:
    return state.index.blocks_by_tier().get(WorkerId(W), {}).get(Tier.DEVICE, 0)


def test_a_skipped_batch_asks_for_a_snapshot_which_clears_the_request():
    async def body():
        store = MemoryStore()
        state = ClusterState(store)
        await state.start()
        try:
            info = common_pb2.WorkerInfo(worker_id=W, role=common_pb2.ROLE_BOTH, endpoint="h:1", model="m")
            await store.put(keys.worker_key(W), info.SerializeToString())
            await store.put(keys.kv_key(W, 1), _batch(1, [b"a"], snapshot=True))
            await store.put(keys.kv_key(W, 2), _batch(2, [b"b"]))
            await _settle(state, lambda: _device_blocks(state) == 2, "the first batches")
            assert not state.snapshot_requested(W)
            # Batch 3 was lost: batch 4 shows the gap.
            await store.put(keys.kv_key(W, 4), _batch(4, [b"d"]))
            await _settle(state, lambda: state.snapshot_requested(W), "the snapshot request")
            await _settle(state, lambda: state.num_gaps_detected == 1, "one gap")
            assert (await store.get(keys.resync_key(W))).value == b"2"
            # The worker's snapshot (everything it holds) replaces the index and clears the request.
            await store.put(keys.kv_key(W, 5), _batch(5, [b"a", b"b", b"c", b"d"], snapshot=True))
            await _settle(state, lambda: not state.snapshot_requested(W), "the request to clear")
            await _settle(state, lambda: _device_blocks(state) == 4, "the snapshot")
            assert await store.get(keys.resync_key(W)) is None
        finally:
            await state.stop()

    asyncio.run(body())


def test_a_load_report_naming_a_batch_the_index_never_got_is_a_gap():
    async def body():
        store = MemoryStore()
        state = ClusterState(store)
        await state.start()
        try:
            info = common_pb2.WorkerInfo(worker_id=W, role=common_pb2.ROLE_BOTH, endpoint="h:1", model="m")
            await store.put(keys.worker_key(W), info.SerializeToString())
            await store.put(keys.kv_key(W, 1), _batch(1, [b"a"], snapshot=True))
            await store.put(keys.load_key(W), _report(kv_seq=1))
            await asyncio.sleep(0.05)
            assert not state.snapshot_requested(W)
            # The worker's last batch (2) never reached the store; its next report says it sent it.
            await store.put(keys.load_key(W), _report(kv_seq=2))
            await _settle(state, lambda: state.snapshot_requested(W), "the snapshot request")
            # A second replica listing the store later sees the request too.
            other = ClusterState(store)
            await other.start()
            assert other.snapshot_requested(W) and other.num_gaps_detected == 0
            await other.stop()
        finally:
            await state.stop()

    asyncio.run(body())
