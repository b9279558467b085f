"""The in-process bus: one replica (`kvplane up`, `kvplane controlplane --store memory`).

Load reports and KV batches go from the registry service to the replica's cluster view through a
queue, never through the store. It retains nothing: its one subscriber (the replica's view)
subscribes before the replica serves, and everything dies with the process, like the embedded store.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from kvplane.v1 import registry_pb2

from .base import BusMessage


class MemoryBus:
    name = "memory"
    carried_by_store = False
    ordered = True

    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[BusMessage | None]] = set()
        self._closed = False

    async def start(self) -> None:
        pass

    async def publish_load(self, report: registry_pb2.ReportLoadRequest) -> None:
        self._deliver(BusMessage("load", report.SerializeToString()))

    async def publish_kv(self, batch: registry_pb2.PublishKVEventsRequest) -> None:
        self._deliver(BusMessage("kv", batch.SerializeToString()))

    async def forget_worker(self, worker_id: str) -> None:
        pass  # nothing retained

    async def subscribe(self) -> AsyncIterator[BusMessage]:
        queue: asyncio.Queue[BusMessage | None] = asyncio.Queue()
        self._subscribers.add(queue)
        return self._read(queue)

    async def _read(self, queue: asyncio.Queue[BusMessage | None]) -> AsyncIterator[BusMessage]:
        try:
            while not self._closed:
                message = await queue.get()
                if message is None:
                    return
                yield message
        finally:
            self._subscribers.discard(queue)

    async def probe(self) -> None:
        pass  # in-process: it works while the process does

    async def close(self) -> None:
        self._closed = True
        for queue in self._subscribers:
            queue.put_nowait(None)

    def _deliver(self, message: BusMessage) -> None:
        for queue in self._subscribers:
            queue.put_nowait(message)
