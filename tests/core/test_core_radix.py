"""RadixTree: held against a plain dict of prefixes under random stores, evictions and lookups."""

from __future__ import annotations

import hashlib
import random

import pytest

from kvplane.controlplane.core.radix import RadixTree
from kvplane.types import BlockHash, Tier

TIERS = (Tier.DEVICE, Tier.HOST, Tier.DISK)


def chain(tokens: list[int]) -> list[BlockHash]:
    """Chained block hashes of one token per block: equal hashes at i mean equal tokens up to i."""
    out, parent = [], b""
    for t in tokens:
        parent = hashlib.blake2b(parent + t.to_bytes(2, "big"), digest_size=8).digest()
        out.append(BlockHash(parent))
    return out


def reference(held: dict[int, dict[Tier, set[BlockHash]]], hashes: list[BlockHash]) -> dict[int, tuple[int, int, int]]:
    """bit -> (leading blocks held at any tier, of them only on host, only on disk): every worker walked."""
    out = {}
    for bit, by_tier in held.items():
        n = host = disk = 0
        for h in hashes:
            tiers = [t for t in TIERS if h in by_tier.get(t, ())]
            if not tiers:
                break
            n += 1
            host += tiers[0] is Tier.HOST
            disk += tiers[0] is Tier.DISK
        if n:
            out[bit] = (n, host, disk)
    return out


def answer(tree: RadixTree, hashes: list[BlockHash]) -> dict[int, tuple[int, int, int]]:
    groups, slower = tree.prefix_groups(hashes)
    lengths = [n for n, _ in groups]
    assert lengths == sorted(set(lengths)) and all(mask > 0 for _, mask in groups)  # shortest first, one entry per length
    out: dict[int, tuple[int, int, int]] = {}
    for n, mask in groups:
        for bit in range(mask.bit_length()):
            if mask >> bit & 1:
                assert bit not in out  # a worker is in one group
                out[bit] = (n, *slower.get(bit, (0, 0)))
    assert set(slower) <= set(out)
    return out


def check_nodes(tree: RadixTree) -> None:
    """Each hash is filed under the node whose run lists it, and nobody's empty node is kept."""
    for h, node in tree._nodes.items():
        assert node.holders == node.device | node.host | node.disk and node.holders
        assert node.run is None or h in node.run
        for other in node.run or ():
            assert tree._nodes[other] is node


@pytest.mark.parametrize("seed", range(6))
def test_radix_equals_a_dict_of_prefixes_under_random_operations(seed):
    rng = random.Random(seed)
    # A small alphabet makes prompts share prefixes and branch; some are long runs.
    prompts = [chain([rng.randrange(3) for _ in range(rng.randrange(1, 60))]) for _ in range(24)]
    tree, held = RadixTree(), {}
    num_lookups = num_compressed = 0
    for _ in range(4000):
        op = rng.random()
        bit = rng.randrange(12)
        prompt = rng.choice(prompts)
        if op < 0.3:  # stored: a prefix, mostly on the device
            tier = rng.choices(TIERS, weights=(8, 1, 1))[0]
            start = 0 if rng.random() < 0.8 else rng.randrange(len(prompt))  # now and then not from block 0
            for h in prompt[start : rng.randrange(start, len(prompt)) + 1]:
                tree.add(h, bit, tier)
                held.setdefault(bit, {}).setdefault(tier, set()).add(h)
        elif op < 0.45:  # removed: a tail, or a few blocks anywhere
            tier = rng.choice(TIERS)
            mine = sorted(held.get(bit, {}).get(tier, ()))
            gone = rng.sample(mine, min(len(mine), rng.randrange(1, 6)))
            if rng.random() < 0.5:
                gone = prompt[rng.randrange(len(prompt)) :]
            for h in gone:
                tree.discard(h, bit, tier)
                held.get(bit, {}).get(tier, set()).discard(h)
        elif op < 0.48:  # the worker left
            for tier, blocks in held.pop(bit, {}).items():
                for h in blocks:
                    tree.discard(h, bit, tier)
        else:  # a lookup: a prompt, a prompt with a new tail, or (rarely) hashes that are not a chain
            hashes = list(prompt)
            if op < 0.6:
                hashes = hashes[: rng.randrange(len(hashes)) + 1] + chain([7, 7])
            elif op < 0.62:
                pool = [h for p in prompts for h in p]
                hashes = [rng.choice(pool) for _ in range(rng.randrange(1, 20))]
            assert answer(tree, hashes) == reference(held, hashes)
            num_lookups += 1
            num_compressed += tree.num_nodes() < len(tree)
        if rng.random() < 0.05:
            check_nodes(tree)
    check_nodes(tree)
    assert len(tree) == len({h for by_tier in held.values() for blocks in by_tier.values() for h in blocks})
    assert num_lookups > 1500 and num_compressed > num_lookups // 2  # runs were learned, and held equal throughout


def test_a_shared_prefix_becomes_one_node_and_one_group():
    prefix = chain(list(range(256)))
    tree = RadixTree()
    for bit in range(1000):
        for h in prefix[: 200 if bit % 2 else 256]:
            tree.add(h, bit, Tier.DEVICE)
    everyone, odd = (1 << 1000) - 1, sum(1 << b for b in range(1, 1000, 2))
    assert tree.num_nodes() == 256  # nothing learned before a lookup
    assert tree.prefix_groups(prefix) == ([(200, odd), (256, everyone ^ odd)], {})  # and learns the runs on the way
    assert tree.num_nodes() == 2  # the first 200 blocks (everyone), the next 56 (the even workers)
    assert tree.prefix_groups(prefix + chain([9])) == ([(200, odd), (256, everyone ^ odd)], {})
    # An event on one block of a run dissolves that run only, and the next lookup learns it again.
    tree.discard(prefix[10], 1, Tier.DEVICE)
    assert tree.num_nodes() == 201
    assert tree.prefix_groups(prefix)[0] == [(10, 1 << 1), (200, odd ^ (1 << 1)), (256, everyone ^ odd)]
    assert tree.num_nodes() == 4  # blocks 0-9, block 10, blocks 11-199, blocks 200-255


def test_tiers_of_a_run_count_per_worker():
    blocks = chain([1, 2, 3, 4])
    tree = RadixTree()
    for h in blocks:
        tree.add(h, 0, Tier.DEVICE)
        tree.add(h, 1, Tier.HOST)
    tree.add(blocks[0], 2, Tier.DISK)
    tree.add(blocks[0], 1, Tier.DEVICE)  # the fastest tier counts
    tree.prefix_groups(blocks)
    assert tree.prefix_groups(blocks) == ([(1, 1 << 2), (4, 0b11)], {1: [3, 0], 2: [0, 1]})
    assert tree.tier_masks(blocks[0]) == (0b11, 0b10, 0b100) and tree.holders(blocks[3]) == 0b11
    tree.discard(blocks[0], 1, Tier.DEVICE)
    tree.discard(blocks[0], 1, Tier.HOST)
    assert tree.prefix_groups(blocks) == ([(1, 0b100), (4, 0b1)], {2: [0, 1]})
    assert tree.tier_masks(b"absent") == (0, 0, 0) and tree.holders(b"absent") == 0  # type: ignore[arg-type]
