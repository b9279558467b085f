"""What the adapters of kvplane's own paged engines (reference, sim) share: the engine-interface
methods that hand straight through to the engine, whose block manager, KV events and KV
import/export are the paged pieces in this package, and the stream of a request's outputs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from kvplane.dataplane.engines.base import KVImportExport
from kvplane.dataplane.engines.events import KVCacheEvent
from kvplane.dataplane.engines.request import EngineLoad, EngineOutput
from kvplane.types import BlockHash, Tier


class PagedEngineAdapter:
    """Base of an adapter whose `engine` is a paged engine of this project (it offers KV
    import/export itself, so KV moves through kvplane's transports, not an engine-native path)."""

    engine: Any  # the reference Engine or the SimEngine: the same methods below

    def load(self) -> EngineLoad:
        return self.engine.load()

    def take_kv_events(self) -> list[KVCacheEvent]:
        return self.engine.take_kv_events()

    def cached_block_hashes_by_tier(self) -> Mapping[Tier, list[BlockHash]]:
        return self.engine.cached_block_hashes_by_tier()

    @property
    def kv_transfer(self) -> KVImportExport:
        return self.engine

    @property
    def native_transfer(self) -> None:
        return None  # KV moves through kvplane's transports (kv_transfer)


async def outputs_until_finished(queue: asyncio.Queue[EngineOutput]) -> AsyncIterator[EngineOutput]:
    """A request's outputs from the queue its engine callback fills, up to the finished one."""
    while True:
        out = await queue.get()
        yield out
        if out.finished:
            return
