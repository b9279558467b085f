"""The store as the bus: load reports and KV batches are keys under the worker's lease.

What the control plane did before it had a bus, and still the default with an etcd store: no other
server to run, one ordered stream (the store's revisions), and a dead worker's keys go with its
lease. Every report is a store write that every replica's watch receives, which is what limits
a fleet on it (docs/operations.md: choosing a bus). The replica's store watch delivers these keys
(ClusterState), so nobody subscribes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvplane.controlplane import keys
from kvplane.controlplane.store.base import Store
from kvplane.types import LeaseId
from kvplane.v1 import registry_pb2

from .base import BusError, BusMessage, PerWorkerThrottle

log = logging.getLogger(__name__)


class StoreBus:
    name = "store"
    carried_by_store = True
    ordered = True

    def __init__(self, store: Store, *, kv_compact_every_s: float = 10.0) -> None:
        self._store = store
        self._compaction = PerWorkerThrottle(kv_compact_every_s)

    async def start(self) -> None:
        pass

    async def publish_load(self, report: registry_pb2.ReportLoadRequest) -> None:
        await self._store.put(keys.load_key(report.worker_id), report.SerializeToString(), lease=LeaseId(report.lease_id))

    async def publish_kv(self, batch: registry_pb2.PublishKVEventsRequest) -> None:
        key = keys.kv_key(batch.worker_id, batch.seq)
        await self._store.put(key, batch.SerializeToString(), lease=LeaseId(batch.lease_id))
        if batch.snapshot:
            await self._maybe_compact(batch.worker_id, batch.seq)

    async def forget_worker(self, worker_id: str) -> None:
        pass  # Register's own transaction deletes the worker's KV keys with its old registration

    async def subscribe(self, deliver: Callable[[BusMessage], None]) -> None:
        raise BusError("the store bus is read through the replica's store watch")

    async def probe(self) -> None:
        pass  # the store itself is probed

    async def close(self) -> None:
        pass

    async def _maybe_compact(self, worker_id: str, snapshot_seq: int) -> None:
        if not self._compaction.due(worker_id):
            return
        items, _ = await self._store.get_prefix(keys.kv_prefix(worker_id))
        stale = [kv.key for kv in items if keys.parse_kv_key(kv.key)[1] < snapshot_seq]
        for key in stale:
            await self._store.delete(key)
        if stale:
            log.debug("compacted %d KV batches of %s", len(stale), worker_id)
