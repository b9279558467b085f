"""Prefix-caching block manager (after vLLM v1's KVCacheManager / BlockPool).

Rule: every block has a ref count. A full block whose KV is completely written may be registered
under its chained BlockHash; later requests with the same hash prefix take a ref on it instead of
recomputing. Unreferenced blocks are free: never-hashed ones are handed out first, then cached ones
are evicted least recently released first (a request's blocks are released tail first, so a chain
loses its tail before its head). Registering emits a stored event, eviction a removed event, a reset
a cleared event; the caller drains them with take_events(). "Does not fit" returns None.
Each block has a generation, bumped whenever it is handed out, so a reader outside the lock (the
tier offloader) can tell whether the block was reused under it; `on_stored` hears of every
registration (hashes, block ids) for write-through to lower tiers.
Not thread-safe: the engine serialises calls under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from kvplane.dataplane.engines.events import AllCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvplane.types import BlockHash, Tier


class BlockManager:
    __slots__ = (
        "num_blocks",
        "_ref_counts",
        "_block_to_hash",
        "_hash_to_block",
        "_uncached_free",
        "_next_fresh",
        "_cached_free",
        "_events",
        "_generations",
        "_on_stored",
    )

    def __init__(self, num_blocks: int, on_stored: Callable[[Sequence[BlockHash], Sequence[int]], None] | None = None) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._block_to_hash: list[BlockHash | None] = [None] * num_blocks
        self._hash_to_block: dict[BlockHash, int] = {}
        # Free blocks with no hash, in the order they are handed out: the never-used ones first
        # (ids _next_fresh.. num_blocks - 1, a counter rather than num_blocks entries), then
        # released ones in release order.
        self._next_fresh = 0
        self._uncached_free: OrderedDict[int, None] = OrderedDict()
        # Free blocks that still hold cached KV, least recently released first.
        self._cached_free: OrderedDict[int, None] = OrderedDict()
        self._events: list[KVCacheEvent] = []
        self._generations = [0] * num_blocks
        self._on_stored = on_stored

    # --- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self._next_fresh + len(self._uncached_free) + len(self._cached_free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Unreferenced blocks kept for prefix reuse."""
        return len(self._cached_free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def block_hash(self, block_id: int) -> BlockHash | None:
        return self._block_to_hash[block_id]

    def generation(self, block_id: int) -> int:
        return self._generations[block_id]

    def lookup(self, block_hash: BlockHash) -> int | None:
        return self._hash_to_block.get(block_hash)

    def cached_block_hashes(self) -> list[BlockHash]:
        return list(self._hash_to_block)

    def longest_cached_prefix(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """Block ids holding the longest cached prefix of block_hashes."""
        block_ids: list[int] = []
        for h in block_hashes:
            b = self._hash_to_block.get(h)
            if b is None:
                break
            block_ids.append(b)
        return block_ids

    # --- allocation ----------------------------------------------------------------------
    def allocate_with_prefix(self, block_hashes: Sequence[BlockHash], num_total_blocks: int) -> tuple[list[int], int] | None:
        """Blocks for a request: its cached prefix of block_hashes (ref'd) plus fresh blocks up
        to num_total_blocks. Returns (block ids, number of cached prefix blocks) or None."""
        hit_ids = self.longest_cached_prefix(block_hashes)[:num_total_blocks]
        num_new = num_total_blocks - len(hit_ids)
        # A hit block that is free is taken out of the free pool too, so count it.
        num_hits_free = sum(1 for b in hit_ids if self._ref_counts[b] == 0)
        if num_new + num_hits_free > self.num_free_blocks:
            return None
        for b in hit_ids:
            self.take_ref(b)
        new_ids = self.allocate(num_new)
        assert new_ids is not None  # checked above
        return hit_ids + new_ids, len(hit_ids)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """num_blocks fresh blocks with ref 1, evicting LRU cached blocks if needed; None if short."""
        if num_blocks < 0:
            raise ValueError(f"cannot allocate {num_blocks} blocks")
        if num_blocks > self.num_free_blocks:
            return None
        block_ids: list[int] = []
        evicted: list[BlockHash] = []
        for _ in range(num_blocks):
            if self._next_fresh < self.num_blocks:
                b = self._next_fresh
                self._next_fresh += 1
            elif self._uncached_free:
                b, _ = self._uncached_free.popitem(last=False)
            else:
                b, _ = self._cached_free.popitem(last=False)
                h = self._block_to_hash[b]
                assert h is not None
                del self._hash_to_block[h]
                self._block_to_hash[b] = None
                evicted.append(h)
            self._ref_counts[b] = 1
            self._generations[b] += 1
            block_ids.append(b)
        if evicted:
            self._events.append(BlockRemoved(tuple(evicted), Tier.DEVICE))
        return block_ids

    def take_ref(self, block_id: int) -> None:
        if self._ref_counts[block_id] == 0:
            if self._block_to_hash[block_id] is not None:
                del self._cached_free[block_id]
            else:
                if block_id >= self._next_fresh:
                    raise ValueError(f"block {block_id} was never handed out; nothing to reference")
                del self._uncached_free[block_id]
        self._ref_counts[block_id] += 1

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop one ref on each block, in the given order (callers pass tail first)."""
        for b in block_ids:
            if self._ref_counts[b] <= 0:
                raise ValueError(f"block {b} released more often than it was referenced")
            self._ref_counts[b] -= 1
            if self._ref_counts[b] == 0:
                if self._block_to_hash[b] is not None:
                    self._cached_free[b] = None
                else:
                    self._uncached_free[b] = None

    # --- KV import / export (the engine interface's KVImportExport, dataplane/engines/base.py) ---
    def pin_prefix(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """Takes a ref on each block of the longest cached prefix of block_hashes (a peer pulls
        them without anything being computed); returns their ids in prefix order."""
        block_ids = self.longest_cached_prefix(block_hashes)
        for b in block_ids:
            self.take_ref(b)
        return block_ids

    def missing(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """Indices into block_hashes of the blocks the prefix cache does not hold."""
        return [i for i, h in enumerate(block_hashes) if h not in self._hash_to_block]

    def commit_import(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> list[int]:
        """Registers pulled blocks (each holding one ref of the caller's); a hash that arrived
        meanwhile keeps its existing copy, the caller's ref moves to it and the duplicate is freed.
        Returns the block holding each hash."""
        holders = self.register(block_hashes, block_ids)
        for b, holder in zip(block_ids, holders):
            if holder != b:
                self.take_ref(holder)
                self.release([b])
        return holders

    # --- prefix cache --------------------------------------------------------------------
    def register(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> list[int]:
        """Publish fully written blocks under their hashes (prefix order). A hash already cached
        elsewhere keeps its existing block and this block stays private. Returns, per hash, the
        block now holding it."""
        if len(block_hashes) != len(block_ids):
            raise ValueError(f"{len(block_hashes)} hashes for {len(block_ids)} blocks")
        holders: list[int] = []
        stored: list[BlockHash] = []
        for h, b in zip(block_hashes, block_ids):
            existing = self._hash_to_block.get(h)
            if existing is not None:
                holders.append(existing)
                continue
            if self._block_to_hash[b] is not None:
                raise ValueError(f"block {b} is already registered under another hash")
            if self._ref_counts[b] == 0:
                raise ValueError(f"block {b} is free; only referenced blocks can be registered")
            self._hash_to_block[h] = b
            self._block_to_hash[b] = h
            stored.append(h)
            holders.append(b)
        if stored:
            self._events.append(BlockStored(tuple(stored), Tier.DEVICE))
            if self._on_stored is not None:
                self._on_stored(stored, [self._hash_to_block[h] for h in stored])
        return holders

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any cached block is referenced."""
        if any(self._ref_counts[b] > 0 for b in self._hash_to_block.values()):
            return False
        for b in list(self._cached_free):
            self._block_to_hash[b] = None
            self._uncached_free[b] = None
        self._cached_free.clear()
        self._hash_to_block.clear()
        self._events.append(AllCleared())
        return True

    def take_events(self) -> list[KVCacheEvent]:
        events, self._events = self._events, []
        return events
