"""Predicted cache entries: what the router just sent where, before the worker's KV events say so.

Rule: when a request is routed, its prompt's block hashes are recorded as held on the chosen
worker(s) for `ttl_s` seconds, so the next requests of a burst sharing a new prefix see it and
land together instead of spreading while the first one is still prefilling (Dynamo's
"approximate" KV-router mode keeps such entries with a TTL). A real stored event for a block
replaces its prediction; an expired prediction is dropped. A lookup merges both per position:
block i counts for a worker when the index holds it there (at its fastest tier) or it is
predicted there (credited as device: the worker is computing it now).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from controlplane.core.index import CacheIndex, OverlapScore
from kvplane.types import BlockHash, Tier, WorkerId


class PrefixPredictions:
    __slots__ = ("ttl_s", "_worker_to_expiry", "_first_block_to_workers")

    def __init__(self, ttl_s: float) -> None:
        if ttl_s < 0:
            raise ValueError(f"prediction ttl_s must be >= 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._worker_to_expiry: dict[WorkerId, dict[BlockHash, float]] = {}
        # The first block of every recorded prompt -> the workers it was recorded on: a lookup
        # visits only those (and the index's own holders), not every worker with predictions.
        # Entries may be stale (expired, confirmed); a lookup checks the worker's table.
        self._first_block_to_workers: dict[BlockHash, set[WorkerId]] = {}

    def record(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash], now: float) -> None:
        if self.ttl_s == 0 or not block_hashes:
            return
        table = self._worker_to_expiry.setdefault(worker_id, {})
        for h in [h for h, expiry in table.items() if expiry <= now]:
            del table[h]
            self._unlink_first(h, worker_id)
        expiry = now + self.ttl_s
        for h in block_hashes:
            table[h] = expiry
        self._first_block_to_workers.setdefault(block_hashes[0], set()).add(worker_id)

    def _unlink_first(self, block_hash: BlockHash, worker_id: WorkerId) -> None:
        workers = self._first_block_to_workers.get(block_hash)
        if workers is not None:
            workers.discard(worker_id)
            if not workers:
                del self._first_block_to_workers[block_hash]

    def confirm(self, worker_id: WorkerId, block_hashes: Iterable[BlockHash]) -> None:
        """Real stored events arrived: they replace the predictions."""
        table = self._worker_to_expiry.get(worker_id)
        if table:
            for h in block_hashes:
                if table.pop(h, None) is not None:
                    self._unlink_first(h, worker_id)

    def forget_worker(self, worker_id: WorkerId) -> None:
        for h in self._worker_to_expiry.pop(worker_id, {}):
            self._unlink_first(h, worker_id)

    def num_predicted_in(self, index: CacheIndex, worker_id: WorkerId, block_hashes: Sequence[BlockHash], now: float) -> int:
        """How many of block_hashes are predicted on the worker and not yet reported there: blocks
        being computed there now."""
        table = self._worker_to_expiry.get(worker_id)
        if not table:
            return 0
        return sum(1 for h in block_hashes if table.get(h, 0.0) > now and not index.holds(h, worker_id))

    def overlaps(self, index: CacheIndex, block_hashes: Sequence[BlockHash], now: float) -> dict[WorkerId, OverlapScore]:
        """index.overlaps(block_hashes), extended by live predictions. Only a worker holding or
        predicted to hold block 0 can match (hashes are chained), so only those are walked."""
        result = index.overlaps(block_hashes)
        if not block_hashes or not self._worker_to_expiry:
            return result
        walk = set(self._first_block_to_workers.get(block_hashes[0], ()))
        walk.update(w for w in result if w in self._worker_to_expiry)
        for worker_id in sorted(walk):  # a fixed order: a simulation replays identically
            table = self._worker_to_expiry.get(worker_id)
            if not table:
                continue
            counts = {tier: 0 for tier in Tier}
            num_blocks = 0
            for h in block_hashes:
                expiry = table.get(h)
                if expiry is not None and expiry > now:
                    counts[Tier.DEVICE] += 1
                else:
                    tier = index.fastest_tier(h, worker_id)
                    if tier is None:
                        break
                    counts[tier] += 1
                num_blocks += 1
            known = result.get(worker_id)
            if num_blocks and (known is None or num_blocks > known.num_blocks):
                result[worker_id] = OverlapScore(num_blocks=num_blocks, blocks_by_tier=counts)
        return result
