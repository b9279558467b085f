"""Cache index: which worker holds which KV blocks, at which tier.

Rule: every worker reports numbered event batches (blocks stored at a tier, blocks removed from
a tier, everything cleared) and, now and then, a snapshot of all it holds. Batches are applied
only when their sequence number is above the last one applied for that worker, so replaying the
store's watch from any point is idempotent; a snapshot replaces the worker's whole state and
sets its sequence number. A lookup walks the request's chained block hashes from block 0 and
keeps the set of workers that still hold every block so far, stopping when that set is empty,
so it costs O(matched blocks x matching workers), not O(workers x blocks).

Parameters: none. Idea from Dynamo's radix-tree KV indexer (lib/kv-router) and vLLM's KV
events; because block hashes are chained, a flat hash -> holders map is enough to answer
"longest cached prefix" (equal hash at position i implies equal tokens at 0..i).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvplane.types import BlockHash, Tier, WorkerId

# Fastest first: a block held at several tiers is credited at the first one listed here.
TIERS_FASTEST_FIRST: tuple[Tier, ...] = (Tier.DEVICE, Tier.HOST, Tier.DISK)

# Sequence number of a worker the index has never heard from (or has forgotten): any batch
# with seq >= 0 applies.
NO_SEQ = -1


@dataclass(frozen=True, slots=True)
class StoredEvent:
    block_hashes: tuple[BlockHash, ...]
    tier: Tier


@dataclass(frozen=True, slots=True)
class RemovedEvent:
    block_hashes: tuple[BlockHash, ...]
    tier: Tier


@dataclass(frozen=True, slots=True)
class ClearedEvent:
    """The worker dropped every block at every tier (engine reset, cache flush)."""


KVEvent = StoredEvent | RemovedEvent | ClearedEvent


@dataclass(frozen=True, slots=True)
class OverlapScore:
    # Leading blocks held, contiguous from block 0.
    num_blocks: int
    # Those num_blocks split by the fastest tier each is held at; every Tier is a key.
    blocks_by_tier: Mapping[Tier, int]


def _fastest(tiers: set[Tier]) -> Tier:
    for tier in TIERS_FASTEST_FIRST:
        if tier in tiers:
            return tier
    raise AssertionError("a holder entry never has an empty tier set")


class CacheIndex:
    """In-memory index of block hashes per worker and tier; one per control-plane replica."""

    __slots__ = ("_block_to_worker_tiers", "_worker_to_tier_blocks", "_worker_to_seq")

    def __init__(self) -> None:
        # block -> worker -> tiers it holds the block at (the lookup side).
        self._block_to_worker_tiers: dict[BlockHash, dict[WorkerId, set[Tier]]] = {}
        # worker -> tier -> blocks (the removal and counting side).
        self._worker_to_tier_blocks: dict[WorkerId, dict[Tier, set[BlockHash]]] = {}
        self._worker_to_seq: dict[WorkerId, int] = {}

    # -- writes ----------------------------------------------------------------------------

    def apply_batch(self, worker_id: WorkerId, seq: int, events: Sequence[KVEvent]) -> bool:
        """Apply one batch of events in order; False (and no change) when seq was already applied.

        A gap in seq (e.g. 3 then 5) is applied anyway: the store's watch delivers in order, so
        a gap means a batch was compacted away, and the worker's next snapshot repairs it.
        """
        if seq < 0:
            raise ValueError(f"batch seq must be >= 0, got {seq} from worker {worker_id!r}")
        if seq <= self._worker_to_seq.get(worker_id, NO_SEQ):
            return False
        self._worker_to_tier_blocks.setdefault(worker_id, {})
        for event in events:
            if isinstance(event, StoredEvent):
                for block_hash in event.block_hashes:
                    self._add(worker_id, block_hash, event.tier)
            elif isinstance(event, RemovedEvent):
                for block_hash in event.block_hashes:
                    self._discard(worker_id, block_hash, event.tier)
            elif isinstance(event, ClearedEvent):
                self._clear(worker_id)
            else:
                raise TypeError(
                    f"unknown KV event {type(event).__name__} from worker {worker_id!r}; expected StoredEvent, RemovedEvent or ClearedEvent"
                )
        self._worker_to_seq[worker_id] = seq
        return True

    def apply_snapshot(
        self,
        worker_id: WorkerId,
        seq: int,
        stored_hashes_by_tier: Mapping[Tier, Sequence[BlockHash]],
    ) -> None:
        """Replace everything the worker had with the snapshot; later batches continue after seq.

        Applied unconditionally (even when seq is lower than the last applied), because a
        snapshot is the worker's full truth: a restarted worker starts its numbering over.
        """
        if seq < 0:
            raise ValueError(f"snapshot seq must be >= 0, got {seq} from worker {worker_id!r}")
        self._clear(worker_id)
        self._worker_to_tier_blocks.setdefault(worker_id, {})
        for tier, block_hashes in stored_hashes_by_tier.items():
            for block_hash in block_hashes:
                self._add(worker_id, block_hash, tier)
        self._worker_to_seq[worker_id] = seq

    def remove_worker(self, worker_id: WorkerId) -> None:
        """Forget the worker entirely (its lease expired), including its seq, so a worker that
        registers again under the same id starts fresh. Unknown ids are a no-op."""
        self._clear(worker_id)
        self._worker_to_tier_blocks.pop(worker_id, None)
        self._worker_to_seq.pop(worker_id, None)

    # -- reads -----------------------------------------------------------------------------

    def overlaps(self, block_hashes: Sequence[BlockHash]) -> dict[WorkerId, OverlapScore]:
        """Longest cached prefix of `block_hashes` per worker; workers matching no block are absent."""
        # worker -> per-tier counts of its matched prefix so far; shrinks as workers drop out.
        matching: dict[WorkerId, dict[Tier, int]] = {}
        finished: dict[WorkerId, OverlapScore] = {}
        for position, block_hash in enumerate(block_hashes):
            holders = self._block_to_worker_tiers.get(block_hash)
            if not holders:
                break
            if position == 0:
                matching = {worker_id: {tier: 0 for tier in Tier} for worker_id in holders}
            for worker_id in [w for w in matching if w not in holders]:
                finished[worker_id] = _score(matching.pop(worker_id))
            if not matching:
                break
            for worker_id, counts in matching.items():
                counts[_fastest(holders[worker_id])] += 1
        for worker_id, counts in matching.items():
            finished[worker_id] = _score(counts)
        return finished

    def holder_tiers(self, block_hash: BlockHash, worker_id: WorkerId) -> frozenset[Tier]:
        """Tiers at which the worker holds the block (empty when it does not)."""
        return frozenset(self._block_to_worker_tiers.get(block_hash, {}).get(worker_id, ()))

    def blocks_by_tier(self) -> dict[WorkerId, dict[Tier, int]]:
        """Block counts per known worker and tier (every Tier is a key); a block held at two
        tiers counts at both."""
        return {
            worker_id: {tier: len(tier_blocks.get(tier, ())) for tier in Tier}
            for worker_id, tier_blocks in self._worker_to_tier_blocks.items()
        }

    def num_block_hashes(self) -> int:
        """Distinct block hashes held by any worker at any tier."""
        return len(self._block_to_worker_tiers)

    def worker_ids(self) -> set[WorkerId]:
        return set(self._worker_to_seq)

    def last_seq(self, worker_id: WorkerId) -> int:
        """Last applied batch or snapshot seq; NO_SEQ (-1) for a worker the index does not know."""
        return self._worker_to_seq.get(worker_id, NO_SEQ)

    # -- internals -------------------------------------------------------------------------

    def _add(self, worker_id: WorkerId, block_hash: BlockHash, tier: Tier) -> None:
        self._worker_to_tier_blocks[worker_id].setdefault(tier, set()).add(block_hash)
        self._block_to_worker_tiers.setdefault(block_hash, {}).setdefault(worker_id, set()).add(tier)

    def _discard(self, worker_id: WorkerId, block_hash: BlockHash, tier: Tier) -> None:
        # Removing a block the index never saw is normal after a compacted gap; ignore it.
        self._worker_to_tier_blocks[worker_id].get(tier, set()).discard(block_hash)
        holders = self._block_to_worker_tiers.get(block_hash)
        if holders is None or worker_id not in holders:
            return
        holders[worker_id].discard(tier)
        if not holders[worker_id]:
            del holders[worker_id]
            if not holders:
                del self._block_to_worker_tiers[block_hash]

    def _clear(self, worker_id: WorkerId) -> None:
        tier_blocks = self._worker_to_tier_blocks.get(worker_id)
        if not tier_blocks:
            return
        for tier, block_hashes in tier_blocks.items():
            for block_hash in list(block_hashes):
                self._discard(worker_id, block_hash, tier)
        tier_blocks.clear()


def _score(counts: dict[Tier, int]) -> OverlapScore:
    return OverlapScore(num_blocks=sum(counts.values()), blocks_by_tier=counts)
