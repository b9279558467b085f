"""CacheIndex: event ordering, idempotent replays, snapshots, removal, tier counts, overlaps."""

from __future__ import annotations

import random

import pytest

from kvplane.controlplane.core.index import (
    NO_SEQ,
    CacheIndex,
    ClearedEvent,
    OverlapScore,
    RemovedEvent,
    StoredEvent,
    bit_array,
    set_bits,
)
from kvplane.types import BlockHash, Tier, WorkerId

W1, W2, W3, W4 = WorkerId("w1"), WorkerId("w2"), WorkerId("w3"), WorkerId("w4")


def tiers(device: int = 0, host: int = 0, disk: int = 0) -> dict[Tier, int]:
    return {Tier.DEVICE: device, Tier.HOST: host, Tier.DISK: disk}


def stored(*names: str, tier: Tier = Tier.DEVICE) -> StoredEvent:
    return StoredEvent(tuple(n.encode() for n in names), tier)  # type: ignore[arg-type]


def removed(*names: str, tier: Tier = Tier.DEVICE) -> RemovedEvent:
    return RemovedEvent(tuple(n.encode() for n in names), tier)  # type: ignore[arg-type]


def query(index: CacheIndex, *names: str) -> dict[WorkerId, OverlapScore]:
    return index.overlaps([n.encode() for n in names])  # type: ignore[misc]


def test_overlap_counts_leading_blocks_of_one_worker(index):
    assert index.apply_batch(W1, 0, [stored("a", "b", "c")])
    assert query(index, "a", "b", "c", "d") == {W1: OverlapScore(3, tiers(device=3))}


def test_overlaps_on_branching_prefixes(index):
    index.apply_batch(W1, 0, [stored("a", "b", "c")])
    index.apply_batch(W2, 0, [stored("a", "b", "x")])
    index.apply_batch(W3, 0, [stored("a")])
    index.apply_batch(W4, 0, [stored("b", "c")])  # holds later blocks but not block 0: no match
    assert query(index, "a", "b", "c") == {
        W1: OverlapScore(3, tiers(device=3)),
        W2: OverlapScore(2, tiers(device=2)),
        W3: OverlapScore(1, tiers(device=1)),
    }
    assert query(index, "a", "b", "x") == {
        W1: OverlapScore(2, tiers(device=2)),
        W2: OverlapScore(3, tiers(device=3)),
        W3: OverlapScore(1, tiers(device=1)),
    }


def test_overlap_stops_at_first_gap(index):
    index.apply_batch(W1, 0, [stored("a", "c")])
    assert query(index, "a", "b", "c") == {W1: OverlapScore(1, tiers(device=1))}


def test_overlap_of_nothing_held_or_empty_query_is_empty(index):
    index.apply_batch(W1, 0, [stored("a")])
    assert query(index, "z", "a") == {}
    assert query(index) == {}


def test_block_at_several_tiers_counts_once_at_its_fastest(index):
    index.apply_batch(W1, 0, [stored("a", tier=Tier.DISK), stored("a", tier=Tier.HOST), stored("b", tier=Tier.DEVICE)])
    index.apply_batch(W1, 1, [stored("b", tier=Tier.DISK), stored("c", tier=Tier.DISK)])
    assert query(index, "a", "b", "c") == {W1: OverlapScore(3, tiers(device=1, host=1, disk=1))}


def test_overlap_walk_stops_when_no_worker_still_matches(index):
    """Cost is O(matched blocks): the walk reads in chunks of doubling length (8, 16, ...) and
    stops after the chunk where the longest match ends."""
    index.apply_batch(W1, 0, [stored("a", "b")])
    index.apply_batch(W2, 0, [stored("c")])  # "c" exists, but only at a worker that lacks "a"

    class CountingList(list):
        num_read = 0

        def __getitem__(self, i):
            item = super().__getitem__(i)
            self.num_read += len(item) if isinstance(i, slice) else 1
            return item

        def __iter__(self):
            for item in super().__iter__():
                self.num_read += 1
                yield item

    long_query = CountingList([b"a", b"b", b"c"] + [b"x%d" % i for i in range(1000)])
    assert index.overlaps(long_query) == {W1: OverlapScore(2, tiers(device=2))}
    assert long_query.num_read <= 8 + 3  # the first chunk, and the blocks of the answer's prefix
    missing_first = CountingList([b"z"] + [b"x%d" % i for i in range(1000)])
    assert index.overlaps(missing_first) == {}
    assert missing_first.num_read <= 8
    index.apply_batch(W1, 1, [stored(*(f"y{i}" for i in range(40)))])
    long_match = CountingList([b"y%d" % i for i in range(40)] + [b"x%d" % i for i in range(1000)])
    assert index.overlaps(long_match) == {W1: OverlapScore(40, tiers(device=40))}
    assert long_match.num_read <= 8 + 16 + 32 + 40  # the chunks up to the one where the match ends, and the prefix


def test_events_in_a_batch_apply_in_order(index):
    index.apply_batch(W1, 0, [stored("a"), removed("a"), removed("b"), stored("b")])
    assert index.blocks_by_tier() == {W1: tiers(device=1)}
    assert query(index, "b") == {W1: OverlapScore(1, tiers(device=1))}
    assert query(index, "a") == {}


def test_cleared_drops_every_tier_and_later_events_in_the_batch_still_apply(index):
    index.apply_batch(W1, 0, [stored("a", "b"), stored("c", tier=Tier.HOST)])
    index.apply_batch(W2, 0, [stored("a")])
    index.apply_batch(W1, 1, [ClearedEvent(), stored("z", tier=Tier.DISK)])
    assert index.blocks_by_tier() == {W1: tiers(disk=1), W2: tiers(device=1)}
    assert query(index, "a", "b") == {W2: OverlapScore(1, tiers(device=1))}
    assert query(index, "z") == {W1: OverlapScore(1, tiers(disk=1))}


def test_replayed_batches_are_ignored(index):
    first = [stored("a")]
    assert index.apply_batch(W1, 1, first)
    assert index.apply_batch(W1, 2, [removed("a")])
    # The store's watch replays from an older revision: seq 1 again and seq 2 again.
    assert index.apply_batch(W1, 1, first) is False
    assert index.apply_batch(W1, 2, [removed("a")]) is False
    assert query(index, "a") == {}
    assert index.last_seq(W1) == 2


def test_sequence_numbers_are_per_worker_and_gaps_still_apply(index):
    assert index.apply_batch(W1, 5, [stored("a")])
    assert index.apply_batch(W2, 0, [stored("a")])
    assert index.apply_batch(W1, 9, [stored("b")])  # 6..8 compacted away
    assert index.last_seq(W1) == 9
    assert index.last_seq(W2) == 0
    assert query(index, "a", "b") == {W1: OverlapScore(2, tiers(device=2)), W2: OverlapScore(1, tiers(device=1))}


def test_unknown_worker_has_no_seq_and_seq_zero_applies(index):
    assert index.last_seq(W1) == NO_SEQ == -1
    assert index.apply_batch(W1, 0, [])
    assert index.last_seq(W1) == 0
    assert index.worker_ids() == {W1}
    assert index.blocks_by_tier() == {W1: tiers()}


def test_negative_seq_is_refused(index):
    with pytest.raises(ValueError, match="batch seq must be >= 0, got -1 from worker 'w1'"):
        index.apply_batch(W1, -1, [stored("a")])
    with pytest.raises(ValueError, match="snapshot seq must be >= 0"):
        index.apply_snapshot(W1, -1, {})


def test_unknown_event_type_is_refused(index):
    with pytest.raises(TypeError, match="unknown KV event str from worker 'w1'"):
        index.apply_batch(W1, 0, ["stored a"])  # type: ignore[list-item]


def test_snapshot_replaces_everything_and_sets_seq(index):
    index.apply_batch(W1, 3, [stored("a", "b"), stored("c", tier=Tier.DISK)])
    index.apply_batch(W2, 0, [stored("a")])
    index.apply_snapshot(W1, 10, {Tier.HOST: [b"x", b"y"], Tier.DEVICE: [b"x"]})
    assert index.blocks_by_tier() == {W1: tiers(device=1, host=2), W2: tiers(device=1)}
    assert query(index, "a", "b") == {W2: OverlapScore(1, tiers(device=1))}
    assert query(index, "x", "y") == {W1: OverlapScore(2, tiers(device=1, host=1))}
    assert index.last_seq(W1) == 10
    assert index.apply_batch(W1, 10, [stored("q")]) is False
    assert index.apply_batch(W1, 11, [removed("y", tier=Tier.HOST)])
    assert query(index, "x", "y") == {W1: OverlapScore(1, tiers(device=1))}


def test_snapshot_with_lower_seq_applies_because_a_restarted_worker_renumbers(index):
    index.apply_batch(W1, 50, [stored("a")])
    index.apply_snapshot(W1, 0, {Tier.DEVICE: [b"b"]})
    assert index.last_seq(W1) == 0
    assert query(index, "a") == {}
    assert index.apply_batch(W1, 1, [stored("c")])
    assert index.blocks_by_tier() == {W1: tiers(device=2)}


def test_remove_worker_forgets_blocks_and_seq_but_not_other_workers(index):
    index.apply_batch(W1, 7, [stored("a", "b")])
    index.apply_batch(W2, 0, [stored("a")])
    index.remove_worker(W1)
    index.remove_worker(WorkerId("never-seen"))  # no-op
    assert index.worker_ids() == {W2}
    assert index.blocks_by_tier() == {W2: tiers(device=1)}
    assert query(index, "a", "b") == {W2: OverlapScore(1, tiers(device=1))}
    assert index.last_seq(W1) == NO_SEQ
    # Re-registered under the same id: numbering starts over.
    assert index.apply_batch(W1, 0, [stored("b")])
    assert query(index, "b") == {W1: OverlapScore(1, tiers(device=1))}


def test_blocks_by_tier_counts_each_tier_a_block_is_held_at(index):
    index.apply_batch(W1, 0, [stored("a", "b"), stored("a", tier=Tier.HOST), stored("d", tier=Tier.DISK)])
    assert index.blocks_by_tier() == {W1: tiers(device=2, host=1, disk=1)}
    # Removing from one tier keeps the copy at the other.
    index.apply_batch(W1, 1, [removed("a"), removed("d", tier=Tier.HOST)])
    assert index.blocks_by_tier() == {W1: tiers(device=1, host=1, disk=1)}
    assert query(index, "a") == {W1: OverlapScore(1, tiers(host=1))}
    index.apply_batch(W1, 2, [removed("a", tier=Tier.HOST)])
    assert query(index, "a") == {}


def test_duplicate_store_is_counted_once(index):
    index.apply_batch(W1, 0, [stored("a"), stored("a")])
    index.apply_batch(W1, 1, [stored("a")])
    assert index.blocks_by_tier() == {W1: tiers(device=1)}
    index.apply_batch(W1, 2, [removed("a")])
    assert query(index, "a") == {}


def test_a_removed_workers_bit_is_reused_without_its_blocks(index):
    index.apply_batch(W1, 0, [stored("a", "b")])
    index.apply_batch(W2, 0, [stored("a")])
    index.remove_worker(W1)
    index.apply_batch(W3, 0, [stored("a")])  # takes W1's freed bit
    assert query(index, "a", "b") == {W2: OverlapScore(1, tiers(device=1)), W3: OverlapScore(1, tiers(device=1))}
    assert index.holder_tiers(b"b", W3) == frozenset()


def test_a_thousand_workers_on_a_hot_prefix_with_mixed_tiers(index):
    workers = [WorkerId(f"w{i}") for i in range(1000)]
    for i, w in enumerate(workers):
        index.apply_batch(w, 0, [stored("p0", "p1", "p2"), stored("p3", tier=Tier.HOST if i % 2 else Tier.DEVICE)])
        if i % 10 == 0:
            index.apply_batch(w, 1, [stored("p4", tier=Tier.DISK)])
    scores = query(index, "p0", "p1", "p2", "p3", "p4", "p5")
    assert len(scores) == 1000
    assert scores[workers[0]] == OverlapScore(5, tiers(device=4, disk=1))
    assert scores[workers[10 + 1]] == OverlapScore(4, tiers(device=3, host=1))
    assert scores[workers[20]] == OverlapScore(5, tiers(device=4, disk=1))
    assert scores[workers[2]] == OverlapScore(4, tiers(device=4))


def test_num_blocks_counts_a_workers_blocks_over_its_tiers():
    index = CacheIndex()
    index.apply_snapshot(WorkerId("w"), 1, {Tier.DEVICE: [BlockHash(b"a"), BlockHash(b"b")], Tier.HOST: [BlockHash(b"a")]})
    assert index.num_blocks(WorkerId("w")) == 3 and index.num_blocks(WorkerId("other")) == 0


def test_set_bits_on_sparse_and_dense_masks():
    rng = random.Random(3)
    for num_bits in (0, 1, 5, 16, 17, 300, 1000):  # both sides of the unpacking path
        positions = sorted(rng.sample(range(1200), num_bits))
        mask = sum(1 << p for p in positions)
        assert set_bits(mask) == positions and bit_array(mask).tolist() == positions


def _snapshot_by_clearing(index: CacheIndex, worker_id: WorkerId, seq: int, by_tier) -> None:
    """The snapshot rule as the index applied it before it applied differences: forget everything
    the worker had, then store the snapshot (blocks credited before keep their credit)."""
    credited = set().union(*index._worker_to_tier_blocks.get(worker_id, {}).values())
    index._departed.pop(worker_id, None)
    index._clear(worker_id)
    index._worker_to_tier_blocks.setdefault(worker_id, {})
    for tier, block_hashes in by_tier.items():
        for block_hash in block_hashes:
            if block_hash in credited:
                index._add(worker_id, block_hash, tier)
            else:
                index._stored(worker_id, block_hash, tier)
    index._worker_to_seq[worker_id] = seq


@pytest.mark.parametrize("credit_routed_only", [False, True])
def test_a_snapshot_applied_as_a_difference_leaves_what_clearing_and_storing_it_leaves(credit_routed_only):
    """apply_snapshot writes only what changed; after random batches, vouches, lookups (which
    merge runs) and snapshots on several workers, every worker's credited and uncredited blocks,
    every block's holders per tier and every lookup equal an index that cleared the worker and
    stored the snapshot anew (and num_blocks, kept as counts, equals a walk over the blocks)."""
    rng = random.Random(11)
    prompts = [[BlockHash(f"p{p}-{i}".encode()) for i in range(12)] for p in range(4)]
    universe = [h for prompt in prompts for h in prompt]
    workers = [W1, W2, W3]
    fast, ref = CacheIndex(credit_routed_only), CacheIndex(credit_routed_only)
    seq = dict.fromkeys(workers, 0)
    for step in range(400):
        w = rng.choice(workers)
        action = rng.random()
        if action < 0.45:
            seq[w] += 1
            prompt = rng.choice(prompts)
            blocks = tuple(prompt[: rng.randrange(1, len(prompt) + 1)])
            tier = rng.choice(list(Tier))
            event = StoredEvent(blocks, tier) if rng.random() < 0.7 else RemovedEvent(blocks[rng.randrange(len(blocks)) :], tier)
            for index in (fast, ref):
                index.apply_batch(w, seq[w], [event])
        elif action < 0.55:
            prompt = rng.choice(prompts)
            vouched = prompt[: rng.randrange(1, len(prompt) + 1)]
            for index in (fast, ref):
                index.vouch(w, vouched)
        elif action < 0.7:
            prompt = rng.choice(prompts)
            assert fast.overlaps(prompt) == ref.overlaps(prompt), f"step {step}"
        else:
            seq[w] += 1
            by_tier = {t: rng.sample(universe, rng.randrange(0, 10)) for t in rng.sample(list(Tier), rng.randrange(0, 4))}
            fast.apply_snapshot(w, seq[w], by_tier)
            _snapshot_by_clearing(ref, w, seq[w], by_tier)
        for worker in workers:
            got = {t: b for t, b in fast._worker_to_tier_blocks.get(worker, {}).items() if b}
            want = {t: b for t, b in ref._worker_to_tier_blocks.get(worker, {}).items() if b}
            assert got == want, f"step {step}: {worker}"
            assert fast._uncredited.get(worker, {}) == ref._uncredited.get(worker, {}), f"step {step}: {worker}"
            # num_blocks keeps its uncredited pairs as a count: the walk over them says the same.
            walked = sum(map(len, got.values())) + sum(map(len, fast._uncredited.get(worker, {}).values()))
            assert fast.num_blocks(worker) == walked, f"step {step}: {worker}"
            for h in universe:
                assert fast.holder_tiers(h, worker) == ref.holder_tiers(h, worker), f"step {step}: {worker}"
    for prompt in prompts:
        assert fast.overlaps(prompt) == ref.overlaps(prompt)


def test_the_answer_as_groups_reads_as_the_dict_of_every_holder():
    """Overlaps: one worker's score, iteration and a table's rows agree with the scores one by one,
    for a shared prefix's many holders, a prompt's holders in parts and blocks off the device."""
    rng = random.Random(5)
    names = [f"p{i}" for i in range(12)]
    for trial in range(40):
        index = CacheIndex()
        workers = [WorkerId(f"w{i}") for i in range(rng.randrange(1, 80))]
        for w in workers:
            shared = rng.random() < 0.6
            length = 4 if shared else rng.randrange(1, len(names))
            tier = Tier.HOST if trial % 4 == 0 and rng.random() < 0.1 else Tier.DEVICE
            index.apply_batch(w, 0, [stored(*names[:length], tier=tier)])
        index.apply_batch(WorkerId("other"), 0, [stored("elsewhere")])  # indexed, holding none of the prompt
        fresh = query(index, *names)  # each worker looked up before any reader iterates (by its bit where the groups are few)
        assert [fresh.get(w) for w in workers] == [fresh.as_dict().get(w) for w in workers]
        assert fresh.get(WorkerId("other")) is None and fresh.get(WorkerId("other"), "none") == "none"
        answer = query(index, *names)
        row_of = {w: i for i, w in enumerate(reversed(workers))}  # a table with its own order
        found = answer.held_rows(row_of)  # (before any dict is made: then the scores are read instead)
        scores = {w: index.overlaps([n.encode() for n in names])[w] for w in workers if w in answer}
        assert dict(answer) == scores and len(answer) == len(scores)
        assert answer.get(WorkerId("nobody")) is None and answer.held_rows(row_of) is None
        if answer.slower:
            assert found is None
            continue
        rows, numbers = found
        assert sorted(zip(rows.tolist(), numbers.T.tolist())) == sorted(
            (row_of[w], [s.num_blocks, s.blocks_by_tier[Tier.HOST], s.blocks_by_tier[Tier.DISK]]) for w, s in scores.items()
        )


def test_the_answer_names_the_holders_of_its_walk_after_their_bits_are_reused(index):
    index.apply_batch(W1, 0, [stored("a", "b")])
    index.apply_batch(W2, 0, [stored("a")])
    answer = query(index, "a", "b")
    index.remove_worker(W1)
    index.apply_batch(W3, 0, [stored("a", "b")])  # takes W1's freed bit
    assert answer.held_rows({W1: 0, W2: 1, W3: 2})[0].tolist() == [1, 0]  # W2 (1 block), W1 (2): the walk's order
    assert dict(answer) == {W1: OverlapScore(2, tiers(device=2)), W2: OverlapScore(1, tiers(device=1))}
    assert answer[W1].num_blocks == 2 and W3 not in answer
    assert query(index, "a", "b")[W3].num_blocks == 2
