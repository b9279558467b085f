"""Predicted cache entries: what the router just sent where, before the worker's KV events say so.

Rule: when a request is routed, its prompt's block hashes are recorded as held on the chosen
worker(s) for `ttl_s` seconds, so the next requests of a burst sharing a new prefix see it and
land together instead of spreading while the first one is still prefilling (Dynamo's
"approximate" KV-router mode keeps such entries with a TTL). A real stored event for a block
replaces its prediction; an expired prediction is dropped. A lookup merges both per position:
block i counts for a worker when the index holds it there (at its fastest tier) or it is
predicted there (credited as device: the worker is computing it now). A worker whose every
prediction has expired is dropped at the next lookup, so lookups cost in proportion to the
workers routed to within the last ttl_s, not to every worker ever routed to.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from controlplane.core.index import TIERS_FASTEST_FIRST, CacheIndex, OverlapScore
from kvplane.types import BlockHash, Tier, WorkerId


class PrefixPredictions:
    __slots__ = ("ttl_s", "_worker_to_expiry", "_worker_to_latest")

    def __init__(self, ttl_s: float) -> None:
        if ttl_s < 0:
            raise ValueError(f"prediction ttl_s must be >= 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._worker_to_expiry: dict[WorkerId, dict[BlockHash, float]] = {}
        self._worker_to_latest: dict[WorkerId, float] = {}  # the latest expiry in each table

    def record(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash], now: float) -> None:
        if self.ttl_s == 0 or not block_hashes:
            return
        table = self._worker_to_expiry.setdefault(worker_id, {})
        for h in [h for h, expiry in table.items() if expiry <= now]:
            del table[h]
        expiry = now + self.ttl_s
        for h in block_hashes:
            table[h] = expiry
        self._worker_to_latest[worker_id] = expiry

    def confirm(self, worker_id: WorkerId, block_hashes: Iterable[BlockHash]) -> None:
        """Real stored events arrived: they replace the predictions."""
        table = self._worker_to_expiry.get(worker_id)
        if table:
            for h in block_hashes:
                table.pop(h, None)

    def forget_worker(self, worker_id: WorkerId) -> None:
        self._worker_to_expiry.pop(worker_id, None)
        self._worker_to_latest.pop(worker_id, None)

    def _drop_expired(self, now: float) -> None:
        for worker_id in [w for w, latest in self._worker_to_latest.items() if latest <= now]:
            self.forget_worker(worker_id)

    def num_predicted_in(self, index: CacheIndex, worker_id: WorkerId, block_hashes: Sequence[BlockHash], now: float) -> int:
        """How many of block_hashes are predicted on the worker and not yet reported there: blocks
        being computed there now."""
        table = self._worker_to_expiry.get(worker_id)
        if not table or self._worker_to_latest[worker_id] <= now:
            return 0
        return sum(1 for h in block_hashes if table.get(h, 0.0) > now and not index.holder_tiers(h, worker_id))

    def overlaps(self, index: CacheIndex, block_hashes: Sequence[BlockHash], now: float) -> dict[WorkerId, OverlapScore]:
        """index.overlaps(block_hashes), extended by live predictions."""
        result = index.overlaps(block_hashes)
        self._drop_expired(now)
        for worker_id, table in self._worker_to_expiry.items():
            if not table:
                continue
            counts = {tier: 0 for tier in Tier}
            num_blocks = 0
            for h in block_hashes:
                expiry = table.get(h)
                if expiry is not None and expiry > now:
                    counts[Tier.DEVICE] += 1
                else:
                    tiers = index.holder_tiers(h, worker_id)
                    if not tiers:
                        break
                    counts[next(t for t in TIERS_FASTEST_FIRST if t in tiers)] += 1
                num_blocks += 1
            known = result.get(worker_id)
            if num_blocks and (known is None or num_blocks > known.num_blocks):
                result[worker_id] = OverlapScore(num_blocks=num_blocks, blocks_by_tier=counts)
        return result
