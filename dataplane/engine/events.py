"""KV cache events the engine queues for the agent to publish to the cache index."""
from __future__ import annotations

from dataclasses import dataclass

from kvplane.types import BlockHash, Tier


@dataclass(slots=True, frozen=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]  # in prefix order
    tier: Tier = Tier.DEVICE


@dataclass(slots=True, frozen=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    tier: Tier = Tier.DEVICE


@dataclass(slots=True, frozen=True)
class AllCleared:
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllCleared
