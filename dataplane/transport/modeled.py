"""A modeled link around a real transport: what a simulated engine's KV transfers go through.

A simulated engine (dataplane/engines/sim) stores a scaled-down payload per block, so the real
transport code path runs (pins, descriptors, the PullKV stream, chunk checks, commit, failures)
on few bytes. ModeledLinkTransport wraps that transport: a pull of n blocks reports
n x the model's real block bytes (ModeledLink.block_nbytes, from the KV layout) and lasts the
named link's time for them, bytes x 8 / line rate + latency (kvplane.hardware.LinkSpec), divided
by the engine's speedup (simulated seconds per wall second); the real pull's own time counts
toward it. So a decode agent's measured transfer (RequestMetrics.kv_transfer_bytes and _ms, which
the control plane learns its link rate from) is the modeled one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvplane.dataplane.transport.base import KVTransport, PullSource
from kvplane.hardware import LinkSpec


@dataclass(frozen=True, slots=True)
class ModeledLink:
    link: LinkSpec
    block_nbytes: int  # the modeled KV bytes of one block (the layout's, not the payload's)
    speedup: float = 1.0  # simulated seconds per wall second

    def wall_seconds(self, num_blocks: int) -> float:
        return self.link.transfer_seconds(num_blocks * self.block_nbytes) / self.speedup


class ModeledLinkTransport:
    """A KVTransport that moves the inner transport's payload and takes the modeled link's time."""

    def __init__(self, inner: KVTransport, link: ModeledLink) -> None:
        self.inner = inner
        self.link = link
        self.name = inner.name

    def describe(self, block_ids: Sequence[int]) -> bytes:
        return self.inner.describe(block_ids)

    async def pull(self, source: PullSource, src_block_indices: Sequence[int], dst_block_ids: Sequence[int]) -> int:
        started = time.monotonic()
        await self.inner.pull(source, src_block_indices, dst_block_ids)
        num_blocks = len(src_block_indices)
        left = self.link.wall_seconds(num_blocks) - (time.monotonic() - started)
        if left > 0:
            await asyncio.sleep(left)
        return num_blocks * self.link.block_nbytes

    def close(self) -> None:
        self.inner.close()
