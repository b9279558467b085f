"""Predicted cache entries: what the router just sent where, before the worker's KV events say so.

Rule: when a request is routed, its prompt's block hashes are recorded as held on the worker
that computes it (the routing policy's choice: kvplane's records no decode worker whose KV is
pulled in, policies/kvplane.py) for `ttl_s` seconds, so the next requests of a burst sharing a
new prefix see it and land together instead of spreading while the first one is still
prefilling (Dynamo's "approximate" KV-router mode keeps such entries with a TTL). A recorded
prompt is dropped when it expires, or when the worker reports its last block stored (engines
store a prompt's blocks in order, so the index then holds the whole prompt and the prediction
has nothing left to add).

A lookup merges both: a worker matches a prompt as far as its longest live recorded prompt
shares blocks with it (credited as device: the worker is computing them now), then as far as the
index holds the following blocks; when the index alone matches further, the index's match
stands. The blocks past the index's own prefix are the ones being computed (`num_predicted`).

Like the index, every block keeps a bitmask of the workers predicted to hold it. A record is a
prompt from its first block and block hashes are chained (a block's hash names its whole prefix),
so a worker predicted to hold a prompt's block i is predicted to hold every block before it:
along a prompt the masks only lose bits, and equal masks are consecutive. A lookup therefore
binary-searches where the mask changes: O(distinct predicted lengths x log blocks) lookups, not
one per block, whatever the number of predicted workers (a hot prompt routed to hundreds of
workers within the TTL), plus a few steps per predicted worker.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvplane.controlplane.core.index import CacheIndex, OverlapScore, overlap_score, set_bits
from kvplane.types import BlockHash, Tier, WorkerId


class Extended(Mapping[WorkerId, OverlapScore]):
    """The index's overlaps (`base`, not copied: a hot prefix's thousands of holders) with
    predicted prefixes added or extended; `extended` holds those entries alone, so a reader of
    what predictions changed need not compare every holder's."""

    __slots__ = ("base", "extended")

    def __init__(self, cached: Mapping[WorkerId, OverlapScore]) -> None:
        self.base = cached
        self.extended: dict[WorkerId, OverlapScore] = {}

    def __getitem__(self, worker_id: WorkerId) -> OverlapScore:
        score = self.extended.get(worker_id)
        return score if score is not None else self.base[worker_id]

    def __iter__(self):
        yield from self.base
        yield from (w for w in self.extended if w not in self.base)

    def __len__(self) -> int:
        return len(self.base) + sum(1 for w in self.extended if w not in self.base)


@dataclass(slots=True, eq=False)
class _Record:
    """One routed prompt on one worker."""

    worker_id: WorkerId
    bit: int
    block_hashes: tuple[BlockHash, ...]
    expiry: float
    live: bool = True


class PrefixPredictions:
    __slots__ = (
        "ttl_s",
        "_expiries",
        "_seq",
        "_worker_to_records",
        "_block_to_mask",
        "_refs",
        "_worker_to_bit",
        "_bit_to_worker",
        "_free_bits",
    )

    def __init__(self, ttl_s: float) -> None:
        if ttl_s < 0:
            raise ValueError(f"prediction ttl_s must be >= 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._expiries: list[tuple[float, int, _Record]] = []  # a heap: the next record to expire first
        self._seq = itertools.count()  # ties in the heap: oldest first
        # worker -> last block of a recorded prompt -> its live records (confirm finds them by it)
        self._worker_to_records: dict[WorkerId, dict[BlockHash, list[_Record]]] = {}
        self._block_to_mask: dict[BlockHash, int] = {}  # block -> bits of the workers with a live record of it
        # bit -> block -> live records of it there (one small dictionary per worker: no key to
        # build per block, and a record's blocks are looked up where that worker's are)
        self._refs: dict[int, dict[BlockHash, int]] = {}
        self._worker_to_bit: dict[WorkerId, int] = {}
        self._bit_to_worker: dict[int, WorkerId] = {}
        self._free_bits: list[int] = []

    # -- writes ----------------------------------------------------------------------------------

    def record(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash], now: float) -> None:
        """The prompt `block_hashes` (from its first block) was routed to `worker_id` at `now`."""
        if self.ttl_s == 0 or not block_hashes:
            return
        self._expire(now)
        bit = self._worker_to_bit.get(worker_id)
        if bit is None:
            bit = self._free_bits.pop() if self._free_bits else len(self._worker_to_bit)
            self._worker_to_bit[worker_id] = bit
            self._bit_to_worker[bit] = worker_id
        record = _Record(worker_id, bit, tuple(block_hashes), now + self.ttl_s)
        heapq.heappush(self._expiries, (record.expiry, next(self._seq), record))
        self._worker_to_records.setdefault(worker_id, {}).setdefault(record.block_hashes[-1], []).append(record)
        refs = self._refs.setdefault(bit, {})
        _count_in(self._block_to_mask, refs, record.block_hashes, 1 << bit)

    def confirm(self, worker_id: WorkerId, block_hashes: Iterable[BlockHash]) -> None:
        """Real stored events arrived: a recorded prompt whose last block is among them is in the
        index now, and its prediction is dropped."""
        by_last = self._worker_to_records.get(worker_id)
        if not by_last:
            return
        for h in block_hashes:
            for record in list(by_last.get(h, ())):
                self._drop(record)

    def forget_worker(self, worker_id: WorkerId) -> None:
        for records in list(self._worker_to_records.get(worker_id, {}).values()):
            for record in list(records):
                self._drop(record)

    def num_records(self) -> int:
        """Recorded prompts not yet dropped (expired ones are dropped when next looked at)."""
        return sum(len(rs) for by_last in self._worker_to_records.values() for rs in by_last.values())

    # -- reads -----------------------------------------------------------------------------------

    def overlaps(
        self, index: CacheIndex, block_hashes: Sequence[BlockHash], now: float, cached: Mapping[WorkerId, OverlapScore] | None = None
    ) -> Mapping[WorkerId, OverlapScore]:
        """index.overlaps(block_hashes) (`cached`, when the caller has it), extended by live
        predictions (module docstring)."""
        if cached is None:
            cached = index.overlaps(block_hashes)
        if not block_hashes or not self._block_to_mask:
            return cached
        self._expire(now)
        predicted = self._predicted_prefixes(block_hashes)
        if not predicted:
            return cached
        result = Extended(cached)
        for bit, num_predicted_prefix in sorted(predicted.items()):
            worker_id = self._bit_to_worker[bit]
            known = cached.get(worker_id)
            num_indexed = known.num_blocks if known is not None else 0
            if num_predicted_prefix <= num_indexed:
                continue  # the index alone matches as far
            num_blocks, slower = num_predicted_prefix, {Tier.HOST: 0, Tier.DISK: 0}
            while num_blocks < len(block_hashes):  # then as far as the index holds the next blocks
                tier = index.fastest_tier(block_hashes[num_blocks], worker_id)
                if tier is None:
                    break
                if tier is not Tier.DEVICE:
                    slower[tier] += 1
                num_blocks += 1
            result.extended[worker_id] = overlap_score(num_blocks, slower[Tier.HOST], slower[Tier.DISK], num_predicted_prefix - num_indexed)
        return result

    # -- internals -------------------------------------------------------------------------------

    def _predicted_prefixes(self, block_hashes: Sequence[BlockHash]) -> dict[int, int]:
        """bit -> how many leading blocks of `block_hashes` a live record there shares."""
        return predicted_lengths(self._block_to_mask, block_hashes)

    def _expire(self, now: float) -> None:
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            self._drop(heapq.heappop(expiries)[2])

    def _drop(self, record: _Record) -> None:
        if not record.live:
            return
        record.live = False
        bit = record.bit
        refs = self._refs[bit]
        _count_out(self._block_to_mask, refs, record.block_hashes, 1 << bit)
        if not refs:
            del self._refs[bit]
        by_last = self._worker_to_records[record.worker_id]
        same_last = by_last[record.block_hashes[-1]]
        same_last.remove(record)
        if not same_last:
            del by_last[record.block_hashes[-1]]
        if not by_last:  # nothing recorded there any more: its bit is free
            del self._worker_to_records[record.worker_id]
            del self._worker_to_bit[record.worker_id], self._bit_to_worker[bit]
            self._free_bits.append(bit)


def _count_in(mask: dict[BlockHash, int], refs: dict[BlockHash, int], block_hashes: Sequence[BlockHash], flag: int) -> None:
    """A live record of `block_hashes` more on the worker whose bit is `flag`: each block's count
    there (`refs`) up by one, and a block new there gets the bit in its mask."""
    for h in block_hashes:
        n = refs.get(h)
        if n is None:
            refs[h] = 1
            mask[h] = mask.get(h, 0) | flag
        else:
            refs[h] = n + 1


def _count_out(mask: dict[BlockHash, int], refs: dict[BlockHash, int], block_hashes: Sequence[BlockHash], flag: int) -> None:
    """_count_in undone: at zero a block leaves `refs` and the bit leaves its mask (an empty mask
    leaves `mask`)."""
    for h in block_hashes:
        n = refs[h] - 1
        if n:
            refs[h] = n
            continue
        del refs[h]
        remaining = mask[h] ^ flag  # the bit is set: this record held the block there
        if remaining:
            mask[h] = remaining
        else:
            del mask[h]


def predicted_lengths(masks: Mapping[BlockHash, int], block_hashes: Sequence[BlockHash]) -> dict[int, int]:
    """bit -> how many leading blocks of `block_hashes` carry it in `masks`, for masks that only
    lose bits along the prompt (module docstring): each run of one mask is found by a binary
    search for its end."""
    get, n, out = masks.get, len(block_hashes), {}
    start, mask = 0, get(block_hashes[0], 0) if block_hashes else 0
    while mask:
        lo, hi = start + 1, n  # the run's end (the first block with another mask) lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if get(block_hashes[mid], 0) == mask:
                lo = mid + 1
            else:
                hi = mid
        after = get(block_hashes[lo], 0) & mask if lo < n else 0  # (& mask: a bit never comes back)
        out.update(dict.fromkeys(set_bits(mask & ~after), lo))
        start, mask = lo, after
    return out
