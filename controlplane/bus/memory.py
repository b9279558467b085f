"""The in-process bus: one replica (`kvplane up`, `kvplane controlplane --store memory`).

Load reports and KV batches go from the registry service to the replica's cluster view on the
event loop, never through the store. It retains nothing: its one subscriber (the replica's view)
subscribes before the replica serves, and everything dies with the process, like the embedded store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvplane.v1 import registry_pb2

from .base import BusMessage


class MemoryBus:
    name = "memory"
    carried_by_store = False
    ordered = True

    def __init__(self) -> None:
        self._subscribers: list[Callable[[BusMessage], None]] = []

    async def start(self) -> None:
        pass

    async def publish_load(self, report: registry_pb2.ReportLoadRequest) -> None:
        self._deliver(BusMessage("load", report.SerializeToString()))

    async def publish_kv(self, batch: registry_pb2.PublishKVEventsRequest) -> None:
        self._deliver(BusMessage("kv", batch.SerializeToString()))

    async def forget_worker(self, worker_id: str) -> None:
        pass  # nothing retained

    async def subscribe(self, deliver: Callable[[BusMessage], None]) -> None:
        self._subscribers.append(deliver)

    async def probe(self) -> None:
        pass  # in-process: it works while the process does

    async def close(self) -> None:
        self._subscribers.clear()

    def _deliver(self, message: BusMessage) -> None:
        # Soon, not now: applied after the publisher's call returns, in the order published.
        loop = asyncio.get_running_loop()
        for deliver in self._subscribers:
            loop.call_soon(deliver, message)
