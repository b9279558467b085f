"""Prefix-cache block manager: ref counts, LRU eviction order, prefix hits, events."""

from __future__ import annotations

import pytest

from kvplane.dataplane.engines.events import AllCleared, BlockRemoved, BlockStored
from kvplane.dataplane.engines.paged.block_manager import BlockManager
from kvplane.types import BlockHash, Tier


def h(i: int) -> BlockHash:
    return BlockHash(bytes([i]) * 16)


def test_allocate_takes_fresh_blocks_in_order_and_counts() -> None:
    bm = BlockManager(4)
    assert bm.allocate(3) == [0, 1, 2]
    assert [bm.ref_count(b) for b in range(4)] == [1, 1, 1, 0]
    assert (bm.num_free_blocks, bm.num_used_blocks, bm.num_cached_free_blocks) == (1, 3, 0)
    assert bm.allocate(2) is None  # does not fit: None, nothing taken
    assert bm.num_free_blocks == 1
    assert bm.allocate(0) == []
    with pytest.raises(ValueError, match="cannot allocate -1 blocks"):
        bm.allocate(-1)


def test_ref_counts_and_over_release() -> None:
    bm = BlockManager(2)
    [b] = bm.allocate(1)  # type: ignore[misc]
    bm.take_ref(b)
    assert bm.ref_count(b) == 2
    bm.release([b])
    assert bm.ref_count(b) == 1 and bm.num_free_blocks == 1
    bm.release([b])
    assert bm.ref_count(b) == 0 and bm.num_free_blocks == 2
    with pytest.raises(ValueError, match="block 0 released more often than it was referenced"):
        bm.release([b])


def test_register_emits_stored_in_prefix_order_and_lookup() -> None:
    bm = BlockManager(4)
    ids = bm.allocate(3)
    assert ids is not None
    assert bm.register([h(1), h(2), h(3)], ids) == ids
    assert bm.take_events() == [BlockStored((h(1), h(2), h(3)), Tier.DEVICE)]
    assert bm.take_events() == []
    assert [bm.lookup(x) for x in (h(1), h(2), h(3), h(4))] == [0, 1, 2, None]
    assert bm.block_hash(1) == h(2)
    assert bm.cached_block_hashes() == [h(1), h(2), h(3)]


def test_register_keeps_an_existing_holder_for_a_duplicate_hash() -> None:
    bm = BlockManager(4)
    a, b = bm.allocate(2)  # type: ignore[misc]
    bm.register([h(1)], [a])
    bm.take_events()
    assert bm.register([h(1)], [b]) == [a]
    assert bm.block_hash(b) is None
    assert bm.take_events() == []  # nothing new was stored
    with pytest.raises(ValueError, match="already registered under another hash"):
        bm.register([h(9)], [a])
    bm.release([b])
    with pytest.raises(ValueError, match="block 1 is free"):
        bm.register([h(8)], [b])
    with pytest.raises(ValueError, match="2 hashes for 1 blocks"):
        bm.register([h(6), h(7)], [a])


def test_uncached_blocks_are_used_before_cached_ones_are_evicted() -> None:
    bm = BlockManager(3)
    ids = bm.allocate(2)
    bm.register([h(1), h(2)], ids)  # type: ignore[arg-type]
    bm.release(ids[::-1])  # type: ignore[index]
    bm.take_events()
    assert bm.num_cached_free_blocks == 2 and bm.num_free_blocks == 3
    assert bm.allocate(1) == [2]  # the never-hashed block goes first
    assert bm.take_events() == []


def test_lru_eviction_order_follows_release_order() -> None:
    bm = BlockManager(4)
    ids = bm.allocate(4)
    assert ids == [0, 1, 2, 3]
    bm.register([h(10), h(11), h(12), h(13)], ids)
    bm.take_events()
    # Release tail first (as requests do), then re-touch block 0 via a prefix hit.
    bm.release([3, 2, 1, 0])
    got = bm.allocate_with_prefix([h(10)], 1)
    assert got == ([0], 1)
    bm.release([0])  # block 0 is now the most recently released
    assert bm.allocate(2) == [3, 2]
    assert bm.take_events() == [BlockRemoved((h(13), h(12)), Tier.DEVICE)]
    assert bm.allocate(1) == [1]
    assert bm.allocate(1) == [0]
    assert bm.take_events() == [BlockRemoved((h(11),), Tier.DEVICE), BlockRemoved((h(10),), Tier.DEVICE)]
    assert bm.lookup(h(10)) is None and bm.cached_block_hashes() == []


def test_allocate_with_prefix_refs_hits_and_counts_free_hits_against_capacity() -> None:
    bm = BlockManager(4)
    ids = bm.allocate(2)
    bm.register([h(1), h(2)], ids)  # type: ignore[arg-type]
    bm.release(ids[::-1])  # type: ignore[index]
    # Longest prefix stops at the first miss; 2 hits + 2 new = the whole pool.
    assert bm.allocate_with_prefix([h(1), h(2), h(3)], 4) == ([0, 1, 2, 3], 2)
    assert [bm.ref_count(b) for b in range(4)] == [1, 1, 1, 1]
    bm.release([3, 2, 1, 0])
    # 1 hit (free, so it uses a free slot) + 4 new needs 5 > 4 blocks: None and nothing changes.
    assert bm.allocate_with_prefix([h(1)], 5) is None
    assert bm.num_free_blocks == 4 and bm.ref_count(0) == 0
    # A held hit block does not use a free slot.
    bm.take_ref(0)
    # Uncached 3 and 2 (released in that order) go first, then cached block 1 is evicted.
    assert bm.allocate_with_prefix([h(1)], 4) == ([0, 3, 2, 1], 1)
    assert bm.ref_count(0) == 2
    assert bm.take_events() == [BlockStored((h(1), h(2)), Tier.DEVICE), BlockRemoved((h(2),), Tier.DEVICE)]


def test_prefix_miss_in_the_middle_stops_the_hit() -> None:
    bm = BlockManager(4)
    ids = bm.allocate(2)
    bm.register([h(1), h(3)], ids)  # type: ignore[arg-type]
    assert bm.longest_cached_prefix([h(1), h(2), h(3)]) == [0]
    assert bm.longest_cached_prefix([h(2), h(1)]) == []


def test_reset_prefix_cache_only_when_no_cached_block_is_in_use() -> None:
    bm = BlockManager(3)
    ids = bm.allocate(2)
    bm.register([h(1), h(2)], ids)  # type: ignore[arg-type]
    bm.take_events()
    assert bm.reset_prefix_cache() is False
    assert bm.take_events() == []
    bm.release(ids[::-1])  # type: ignore[index]
    assert bm.reset_prefix_cache() is True
    assert bm.take_events() == [AllCleared()]
    assert bm.cached_block_hashes() == [] and bm.num_cached_free_blocks == 0 and bm.num_free_blocks == 3
    assert bm.allocate(3) == [2, 1, 0]
    assert bm.take_events() == []  # no removed events after a clear
