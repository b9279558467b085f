"""An approximate cache view kept from routing decisions alone, as the peers' gateways keep one
by default (SGLang's approximate radix tree, llm-d's approximate prefix-cache scorer).

Rule: when a prompt is routed to a worker, its block hashes count as cached there (touched, in
LRU order, per worker); when a worker holds more than its capacity, its least recently routed
blocks are forgotten. Nothing else: no KV events, so a block the engine evicted is still
believed cached (the approximation the peers make), and a prompt still being prefilled already
counts (what they gain from it: a burst sharing a new prefix lands together).

Kept as a CacheIndex fed with a stored event per routed prompt and a removed event per LRU
eviction, so a lookup is the index's own longest-prefix walk (index.py), not a second one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvplane.controlplane.core.index import CacheIndex, OverlapScore, RemovedEvent, StoredEvent
from kvplane.types import BlockHash, Tier, WorkerId


class RoutedCache:
    __slots__ = ("_index", "_lru", "_seq")

    def __init__(self) -> None:
        self._index = CacheIndex()
        self._lru: dict[WorkerId, OrderedDict[BlockHash, None]] = {}  # oldest first
        self._seq: dict[WorkerId, int] = {}

    def record(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash], capacity_blocks: int) -> None:
        """`block_hashes` were routed to `worker_id`, which believes at most `capacity_blocks`."""
        if not block_hashes or capacity_blocks <= 0:
            return
        lru = self._lru.setdefault(worker_id, OrderedDict())
        new = []
        for h in block_hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                new.append(h)
        evicted = []
        while len(lru) > capacity_blocks:
            evicted.append(lru.popitem(last=False)[0])
        seq = self._seq.get(worker_id, -1) + 1
        self._seq[worker_id] = seq
        self._index.apply_batch(worker_id, seq, [StoredEvent(tuple(new), Tier.DEVICE), RemovedEvent(tuple(evicted), Tier.DEVICE)])

    def overlaps(self, block_hashes: Sequence[BlockHash]) -> dict[WorkerId, OverlapScore]:
        """Per worker believed to hold the first block: how many leading blocks it is believed to hold."""
        return self._index.overlaps(block_hashes)

    def num_blocks(self, worker_id: WorkerId) -> int:
        return len(self._lru.get(worker_id, ()))

    def forget_worker(self, worker_id: WorkerId) -> None:
        self._index.remove_worker(worker_id)
        self._lru.pop(worker_id, None)
        self._seq.pop(worker_id, None)
