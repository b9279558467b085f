"""KV cache events, normalised: every engine reports its cache as these, with a tier, and the
agent publishes them to the cache index."""

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
