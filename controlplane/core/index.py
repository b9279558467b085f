"""Cache index: which worker holds which KV blocks, at which tier.

Rule: every worker reports numbered event batches (blocks stored at a tier, blocks removed from
a tier, everything cleared) and, now and then, a snapshot of all it holds. Batches are applied
only when their sequence number is above the last one applied for that worker, so replaying the
store's watch from any point is idempotent; a snapshot replaces the worker's whole state and
sets its sequence number. A lookup walks the request's chained block hashes from block 0 and
keeps the set of workers that still hold every block so far, stopping when that set is empty.
That set is a bitmask (one bit per worker), and the blocks sit in a compressed radix tree
(core/radix.py) whose nodes are runs of blocks with the same holders per tier, so a step is one
node, a few integer operations whatever the number of holders or blocks in it: a lookup costs
O(branch points) big-int ANDs plus O(matching workers) to report them, not O(workers x blocks),
and workers with the same match share one OverlapScore.

Credit (issue 28: a worker's events are its own claims). With `credit_routed_only`, a block a
worker reports stored is credited (found by lookups) only when the control plane sent that worker
a request with that block (`vouch`: it was asked to compute or import it); every other reported
block is held *uncredited*: counted against the worker's limits and listed, never matched, until
a routed request covers it (then it is credited at once). So a worker's announced blocks (its
first snapshot, blocks of another tenant's prompt it advertises, a generated answer's blocks) pull
no traffic until routing sent it a request with them. A vouch waits for the block's stored event
(the request is still prefilling) among the worker's last `max_vouched_per_worker` vouches; a
credited block removed from its last tier is vouched again, so a move between tiers (removed from
one before it is stored in the next) keeps its credit. A snapshot keeps the credit of the blocks
it still lists, and so does a worker id that leaves and comes back (a restarted agent: its
credited blocks become vouches, kept for the last `MAX_DEPARTED` departed workers, and its first
snapshot finds them). Vouches are this replica's own: another replica credits what it routed.

Parameters: max_vouched_per_worker. Idea from Dynamo's radix-tree KV indexer (lib/kv-router) and vLLM's KV
events; because block hashes are chained, a hash names its whole prefix (equal hash at position i
implies equal tokens at 0..i), so the tree finds a node by any of its hashes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from types import MappingProxyType

import numpy as np

from kvplane.controlplane.core.radix import RadixTree
from kvplane.types import BlockHash, Tier, WorkerId

# Fastest first: a block held at several tiers is credited at the first one listed here.
TIERS_FASTEST_FIRST: tuple[Tier, ...] = (Tier.DEVICE, Tier.HOST, Tier.DISK)

# Sequence number of a worker the index has never heard from (or has forgotten): any batch
# with seq >= 0 applies.
NO_SEQ = -1

MAX_DEPARTED = 256  # departed workers whose credit is kept for their return (credit_routed_only)


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
    # Of those, blocks only predicted there (being computed now, not yet in the index: predictions.py).
    num_predicted: int = 0
    # (num_blocks, host blocks, disk blocks): what routing reads of a score, made once per score
    # (scores are shared: overlap_score), not once per holder and request.
    numbers: tuple[int, int, int] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        tiers = self.blocks_by_tier
        object.__setattr__(self, "numbers", (self.num_blocks, tiers.get(Tier.HOST, 0), tiers.get(Tier.DISK, 0)))


_TIER_SLOT = {tier: slot for slot, tier in enumerate(TIERS_FASTEST_FIRST)}


class _Uncredited(dict):
    """One worker's blocks reported without credit: block -> the tiers it is at. `count` keeps
    the (block, tier) pairs, what a KV batch's capacity check reads, without a walk over them."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def add(self, block_hash: BlockHash, tier: Tier) -> None:
        tiers = self.get(block_hash)
        if tiers is None:
            tiers = self[block_hash] = set()
        if tier not in tiers:
            tiers.add(tier)
            self.count += 1

    def discard(self, block_hash: BlockHash, tier: Tier) -> None:
        tiers = self[block_hash]
        if tier in tiers:
            tiers.discard(tier)
            self.count -= 1
        if not tiers:
            del self[block_hash]

    def take(self, block_hash: BlockHash) -> set[Tier]:
        tiers = self.pop(block_hash)
        self.count -= len(tiers)
        return tiers


_FEW_GROUPS = 4  # Overlaps: up to this many groups, one worker's score is looked up in the masks


class Overlaps(Mapping[WorkerId, OverlapScore]):
    """CacheIndex.overlaps' answer as the radix walk gives it: groups of workers with equal
    matches, each one bit mask, read through the index's bit owners as they were at the walk.
    A worker table's numbers (`held_rows`) cost one numpy gather per group of many workers, and
    one worker's score a test of its bit in each of a few groups; a dict of every holder (a hot
    prefix's thousands) is made only for a reader that iterates, or to look up one of many groups
    (a prompt's holders in parts)."""

    __slots__ = ("groups", "slower", "_owners", "_index", "_dict")

    def __init__(self, groups: list[tuple[int, int]], slower: dict[int, list[int]], owners: tuple, index: CacheIndex) -> None:
        self.groups = groups  # [(blocks matched, bits of the workers matching exactly that many)]
        self.slower = slower  # bit -> [host, disk] blocks of its match held off the device
        self._owners = owners
        self._index = index
        self._dict: dict[WorkerId, OverlapScore] | None = None

    def __getitem__(self, worker_id: WorkerId) -> OverlapScore:
        bit = self._index._worker_to_bit.get(worker_id)
        # Testing a bit costs a pass over the mask (a bit a worker: 1,250 bytes at 10,000
        # workers), so past a few groups the dict answers: a prompt's holders in parts are as
        # many groups as holders, and predictions ask for dozens of them.
        if (
            self._dict is not None
            or len(self.groups) > _FEW_GROUPS
            or bit is None
            or bit >= len(self._owners)
            or self._owners[bit] != worker_id
        ):
            return self.as_dict()[worker_id]  # (the last three: none, or a bit given since the walk)
        for num_blocks, mask in self.groups:
            if mask >> bit & 1:
                return overlap_score(num_blocks, *self.slower.get(bit, (0, 0)))
        raise KeyError(worker_id)

    def __iter__(self):
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self._dict) if self._dict is not None else sum(mask.bit_count() for _, mask in self.groups)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def held_rows(self, row_of: Mapping[WorkerId, int]) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows of `row_of`, their (3, rows) matched / host / disk blocks) of the workers here
        that `row_of` has; None when some match is held off the device, or the dict of scores
        was made already (read the scores then: each group costs big-integer passes here)."""
        if self.slower or self._dict is not None:
            return None
        bits: list[int] = []  # of the small groups (a prompt's holders in parts: one worker a length)
        matched: list[int] = []
        big = []  # (blocks, bits) of the groups of many workers (a shared prefix's holders)
        for num_blocks, mask in self.groups:
            if not mask & (mask - 1):  # one worker (each big-integer step is a pass over the mask)
                bits.append(mask.bit_length() - 1)
                matched.append(num_blocks)
            elif mask.bit_count() > 16:
                big.append((num_blocks, bit_array(mask)))
            else:
                found = set_bits(mask)
                bits += found
                matched += [num_blocks] * len(found)
        all_bits = np.concatenate([np.array(bits, np.int64), *(b for _, b in big)]) if big else np.array(bits, np.int64)
        numbers = np.zeros((3, len(all_bits)), np.int64)
        numbers[0] = np.concatenate([np.array(matched, np.int64), *(np.full(len(b), n, np.int64) for n, b in big)]) if big else matched
        rows = self._index.rows_of_bits(self._owners, row_of)[all_bits]
        known = rows >= 0
        return (rows, numbers) if known.all() else (rows[known], numbers[:, known])

    def as_dict(self) -> dict[WorkerId, OverlapScore]:
        """Every holder's score (made once)."""
        if self._dict is not None:
            return self._dict
        worker_of, slower = self._owners.__getitem__, self.slower
        result: dict[WorkerId, OverlapScore] = {}
        if not slower:  # workers with the same match share its score (rare otherwise: most blocks sit on the device only)
            for num_blocks, mask in self.groups:
                if mask & (mask - 1):
                    result.update(zip(map(worker_of, set_bits(mask)), repeat(overlap_score(num_blocks))))
                else:  # one worker (most lengths of a prompt that holders share in parts)
                    result[worker_of(mask.bit_length() - 1)] = overlap_score(num_blocks)
        else:
            result = {
                worker_of(bit): overlap_score(num_blocks, *slower.get(bit, (0, 0)))
                for num_blocks, mask in self.groups
                for bit in set_bits(mask)
            }
        self._dict = result
        return result


class CacheIndex:
    """In-memory index of block hashes per worker and tier; one per control-plane replica.

    Each worker gets a bit; each run of blocks in the radix tree keeps one bitmask of its holders
    per tier, so a lookup intersects holder sets with integer ANDs (a few hundred nanoseconds for a
    thousand workers) instead of walking every holder of every block.
    """

    __slots__ = (
        "_radix", "_worker_to_tier_blocks", "_worker_to_seq", "_worker_to_bit",
        "_bit_to_worker", "_rows_of_bits", "_free_bits", "credit_routed_only", "max_vouched_per_worker", "_uncredited", "_vouched", "_departed",
    )  # fmt: skip

    def __init__(self, credit_routed_only: bool = False, max_vouched_per_worker: int = 1 << 16) -> None:
        if max_vouched_per_worker < 1:
            raise ValueError(f"max_vouched_per_worker must be >= 1, got {max_vouched_per_worker}")
        self.credit_routed_only = credit_routed_only
        self.max_vouched_per_worker = max_vouched_per_worker
        # worker -> block -> tiers it reported the block at, uncredited (credit_routed_only)
        self._uncredited: dict[WorkerId, _Uncredited] = {}
        # worker -> blocks routed there whose stored event has not come yet, oldest first (a dict as an ordered set)
        self._vouched: dict[WorkerId, dict[BlockHash, None]] = {}
        self._departed: dict[WorkerId, None] = {}  # workers removed with vouches kept, oldest first
        # The lookup side: the credited blocks' holders per tier, as worker bits.
        self._radix = RadixTree()
        # worker -> tier -> blocks (the removal and counting side).
        self._worker_to_tier_blocks: dict[WorkerId, dict[Tier, set[BlockHash]]] = {}
        self._worker_to_seq: dict[WorkerId, int] = {}
        self._worker_to_bit: dict[WorkerId, int] = {}
        # bit -> worker (None: free), replaced whole when it changes (a worker's first block, its
        # removal: rare), so an answer of `overlaps` reads the bits as they were at its walk.
        self._bit_to_worker: tuple[WorkerId | None, ...] = ()
        self._rows_of_bits: tuple[tuple, Mapping, np.ndarray] | None = None  # (owners, row_of, bit -> row)
        self._free_bits: list[int] = []  # bits of removed workers, reused so masks stay narrow

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
        self._departed.pop(worker_id, None)  # back (its kept vouches are its own again)
        for event in events:
            if isinstance(event, StoredEvent):
                for block_hash in event.block_hashes:
                    self._stored(worker_id, block_hash, event.tier)
            elif isinstance(event, RemovedEvent):
                for block_hash in event.block_hashes:
                    self._removed(worker_id, block_hash, event.tier)
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

        Applied as a difference: a worker's periodic snapshot (agents send one every 10 s) mostly
        repeats what its events already said, and only the blocks it adds or drops are written,
        so the runs of the radix tree through the blocks it still holds stay whole. The result is
        that of clearing the worker and storing the snapshot anew: blocks credited before stay
        credited at the tiers the snapshot names, the others are stored as events are (credit
        rules: module docstring).
        """
        if seq < 0:
            raise ValueError(f"snapshot seq must be >= 0, got {seq} from worker {worker_id!r}")
        self._departed.pop(worker_id, None)
        self._uncredited.pop(worker_id, None)  # what the snapshot does not name again is gone
        tier_blocks = self._worker_to_tier_blocks.setdefault(worker_id, {})
        credited = set().union(*tier_blocks.values())
        wanted = {tier: set(block_hashes) for tier, block_hashes in stored_hashes_by_tier.items()}
        for tier, held in list(tier_blocks.items()):  # first what the worker no longer holds there
            for block_hash in held - wanted.get(tier, set()):
                self._discard(worker_id, block_hash, tier)
            if not held:
                del tier_blocks[tier]
        for tier, block_hashes in stored_hashes_by_tier.items():
            held = tier_blocks.get(tier, ())
            for block_hash in block_hashes:
                if block_hash in held:
                    continue
                if block_hash in credited:
                    self._add(worker_id, block_hash, tier)
                else:
                    self._stored(worker_id, block_hash, tier)
        self._worker_to_seq[worker_id] = seq

    def vouch(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash]) -> None:
        """The control plane sent `worker_id` a request with these blocks: credit them there,
        now for those it reported already, else when it reports them (module docstring)."""
        if not self.credit_routed_only:
            return
        uncredited = self._uncredited.get(worker_id)
        vouched = self._vouched.setdefault(worker_id, {})
        bit = self._worker_to_bit.get(worker_id)
        holders = self._radix.holders
        for block_hash in block_hashes:
            if uncredited and block_hash in uncredited:
                for tier in uncredited.take(block_hash):
                    self._add(worker_id, block_hash, tier)
                bit = self._worker_to_bit[worker_id]  # _add gives a worker its bit
            elif bit is None or not holders(block_hash) >> bit & 1:  # not credited there yet
                vouched.pop(block_hash, None)
                vouched[block_hash] = None  # the newest
        while len(vouched) > self.max_vouched_per_worker:
            del vouched[next(iter(vouched))]

    def remove_worker(self, worker_id: WorkerId) -> None:
        """Forget the worker entirely (its lease expired), including its seq, so a worker that
        registers again under the same id starts fresh (but for its credit, credit_routed_only:
        module docstring). Unknown ids are a no-op."""
        if self.credit_routed_only:
            self._keep_credit(worker_id)
        self._clear(worker_id)
        self._worker_to_tier_blocks.pop(worker_id, None)
        self._worker_to_seq.pop(worker_id, None)
        self._uncredited.pop(worker_id, None)
        bit = self._worker_to_bit.pop(worker_id, None)
        if bit is not None:
            owners = list(self._bit_to_worker)
            owners[bit] = None
            self._bit_to_worker = tuple(owners)
            self._free_bits.append(bit)

    # -- reads -----------------------------------------------------------------------------

    def overlaps(self, block_hashes: Sequence[BlockHash]) -> Overlaps:
        """Longest cached prefix of `block_hashes` per worker; workers matching no block are absent."""
        groups, slower = self._radix.prefix_groups(block_hashes)  # slower: bit -> [host, disk] blocks of its match
        return Overlaps(groups, slower, self._bit_to_worker, self)

    def rows_of_bits(self, owners: tuple[WorkerId | None, ...], row_of: Mapping[WorkerId, int]) -> np.ndarray:
        """bit -> row of `row_of` (-1: none) for the bit owners `owners`; kept while both stay
        the same objects (a worker table keeps its row_of while its workers stay)."""
        kept = self._rows_of_bits
        if kept is not None and kept[0] is owners and kept[1] is row_of:
            return kept[2]
        rows = np.fromiter((-1 if w is None else row_of.get(w, -1) for w in owners), np.int64, len(owners))
        self._rows_of_bits = (owners, row_of, rows)
        return rows

    def holder_tiers(self, block_hash: BlockHash, worker_id: WorkerId) -> frozenset[Tier]:
        """Tiers at which the worker holds the block (empty when it does not)."""
        masks = self._radix.tier_masks(block_hash)
        bit = self._worker_to_bit.get(worker_id)
        if bit is None:
            return frozenset()
        return frozenset(tier for tier, slot in _TIER_SLOT.items() if masks[slot] >> bit & 1)

    def holds(self, block_hash: BlockHash, worker_id: WorkerId) -> bool:
        """Whether the worker holds the block at any tier."""
        bit = self._worker_to_bit.get(worker_id)
        return bit is not None and bool(self._radix.holders(block_hash) >> bit & 1)

    def fastest_tier(self, block_hash: BlockHash, worker_id: WorkerId) -> Tier | None:
        """The fastest tier at which the worker holds the block (None: it does not)."""
        bit = self._worker_to_bit.get(worker_id)
        if bit is None:
            return None
        masks = self._radix.tier_masks(block_hash)
        for slot, tier in enumerate(TIERS_FASTEST_FIRST):
            if masks[slot] >> bit & 1:
                return tier
        return None

    def blocks_by_tier(self) -> dict[WorkerId, dict[Tier, int]]:
        """Block counts per known worker and tier (every Tier is a key), credited or not; a block
        held at two tiers counts at both."""
        out = {}
        for worker_id, tier_blocks in self._worker_to_tier_blocks.items():
            counts = {tier: len(tier_blocks.get(tier, ())) for tier in Tier}
            for tiers in self._uncredited.get(worker_id, {}).values():
                for tier in tiers:
                    counts[tier] += 1
            out[worker_id] = counts
        return out

    def num_block_hashes(self) -> int:
        """Distinct block hashes held by any worker at any tier."""
        return len(self._radix)

    def num_blocks(self, worker_id: WorkerId) -> int:
        """Blocks the worker holds, credited or not, over all tiers (a block at two tiers counts twice)."""
        credited = sum(len(blocks) for blocks in self._worker_to_tier_blocks.get(worker_id, {}).values())
        uncredited = self._uncredited.get(worker_id)
        return credited + (uncredited.count if uncredited is not None else 0)

    def num_uncredited(self, worker_id: WorkerId) -> int:
        """Blocks the worker reported that no request routed there covered yet (distinct hashes)."""
        return len(self._uncredited.get(worker_id, {}))

    def worker_ids(self) -> set[WorkerId]:
        return set(self._worker_to_seq)

    def last_seq(self, worker_id: WorkerId) -> int:
        """Last applied batch or snapshot seq; NO_SEQ (-1) for a worker the index does not know."""
        return self._worker_to_seq.get(worker_id, NO_SEQ)

    # -- internals -------------------------------------------------------------------------

    def _bit(self, worker_id: WorkerId) -> int:
        bit = self._worker_to_bit.get(worker_id)
        if bit is None:
            bit = self._free_bits.pop() if self._free_bits else len(self._worker_to_bit)
            self._worker_to_bit[worker_id] = bit
            owners = self._bit_to_worker
            self._bit_to_worker = (*owners, worker_id) if bit == len(owners) else (*owners[:bit], worker_id, *owners[bit + 1 :])
        return bit

    def _add(self, worker_id: WorkerId, block_hash: BlockHash, tier: Tier) -> None:
        self._worker_to_tier_blocks[worker_id].setdefault(tier, set()).add(block_hash)
        self._radix.add(block_hash, self._bit(worker_id), tier)

    def _keep_credit(self, worker_id: WorkerId) -> None:
        """The departing worker's credited blocks become vouches, for its return under this id."""
        vouched = self._vouched.setdefault(worker_id, {})
        for blocks in self._worker_to_tier_blocks.get(worker_id, {}).values():
            vouched.update(dict.fromkeys(blocks))
        while len(vouched) > self.max_vouched_per_worker:
            del vouched[next(iter(vouched))]
        self._departed.pop(worker_id, None)
        self._departed[worker_id] = None
        while len(self._departed) > MAX_DEPARTED:
            gone = next(iter(self._departed))
            del self._departed[gone]
            self._vouched.pop(gone, None)

    def _stored(self, worker_id: WorkerId, block_hash: BlockHash, tier: Tier) -> None:
        """A stored event: credited when the block is credited there already or was vouched for."""
        if self.credit_routed_only and not self.holds(block_hash, worker_id):
            vouched = self._vouched.get(worker_id)
            if vouched is None or vouched.pop(block_hash, 0) is not None:  # not vouched for
                uncredited = self._uncredited.get(worker_id)
                if uncredited is None:
                    uncredited = self._uncredited[worker_id] = _Uncredited()
                uncredited.add(block_hash, tier)
                return
        self._add(worker_id, block_hash, tier)

    def _removed(self, worker_id: WorkerId, block_hash: BlockHash, tier: Tier) -> None:
        if not self.credit_routed_only:
            self._discard(worker_id, block_hash, tier)
            return
        uncredited = self._uncredited.get(worker_id)
        if uncredited is not None and block_hash in uncredited:
            uncredited.discard(block_hash, tier)
            return
        was_held = self.holds(block_hash, worker_id)
        self._discard(worker_id, block_hash, tier)
        if was_held and not self.holds(block_hash, worker_id):  # it may be on its way to another tier
            vouched = self._vouched.setdefault(worker_id, {})
            vouched[block_hash] = None
            if len(vouched) > self.max_vouched_per_worker:
                del vouched[next(iter(vouched))]

    def _discard(self, worker_id: WorkerId, block_hash: BlockHash, tier: Tier) -> None:
        # Removing a block the index never saw is normal after a compacted gap; ignore it.
        self._worker_to_tier_blocks[worker_id].get(tier, set()).discard(block_hash)
        bit = self._worker_to_bit.get(worker_id)
        if bit is not None:
            self._radix.discard(block_hash, bit, tier)

    def _clear(self, worker_id: WorkerId) -> None:
        self._uncredited.pop(worker_id, None)
        tier_blocks = self._worker_to_tier_blocks.get(worker_id)
        if not tier_blocks:
            return
        for tier, block_hashes in tier_blocks.items():
            for block_hash in list(block_hashes):
                self._discard(worker_id, block_hash, tier)
        tier_blocks.clear()


def set_bits(mask: int) -> list[int]:
    """The positions of the set bits of `mask`, lowest first."""
    if mask.bit_count() > 16:  # many workers: unpack all bytes at once
        return bit_array(mask).tolist()
    bits = []
    while mask:
        low = mask & -mask
        bits.append(low.bit_length() - 1)
        mask ^= low
    return bits


def bit_array(mask: int) -> np.ndarray:
    """set_bits as an int64 array."""
    if mask & (mask - 1) == 0:  # one bit (or none)
        return np.array([mask.bit_length() - 1] if mask else [], np.int64)
    packed = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), np.uint8)
    return np.flatnonzero(np.unpackbits(packed, bitorder="little"))


@functools.lru_cache(maxsize=1 << 14)
def overlap_score(num_blocks: int, host: int = 0, disk: int = 0, num_predicted: int = 0) -> OverlapScore:
    """The (read-only) score of a match of num_blocks, host and disk of them off the device:
    workers with the same match share it, a hot prefix's thousand holders and every lookup that
    finds the same."""
    counts = MappingProxyType({Tier.DEVICE: num_blocks - host - disk, Tier.HOST: host, Tier.DISK: disk})
    return OverlapScore(num_blocks=num_blocks, blocks_by_tier=counts, num_predicted=num_predicted)
