"""Chained block hashes (kvplane.block_hash): the batch path equals the block-by-block rule."""

from __future__ import annotations

import random

import pytest

from kvplane.block_hash import CachedBlockHasher, chain_hash, hash_blocks, root_hash


def test_hash_blocks_chains_chain_hash_over_full_blocks_only():
    tokens = [random.Random(1).randrange(2**32) for _ in range(37)]
    expected, parent = [], root_hash("m", "t")
    for start in (0, 16):  # the partial tail (5 tokens) is never hashed
        parent = chain_hash(parent, tokens[start : start + 16])
        expected.append(parent)
    assert hash_blocks(tokens, 16, "m", "t") == expected


def test_salts_and_prefixes_change_every_later_hash():
    tokens = list(range(64))
    base = hash_blocks(tokens, 16, "m", "")
    assert hash_blocks(tokens, 16, "m", "tenant")[0] != base[0]
    assert hash_blocks(tokens, 16, "other", "")[0] != base[0]
    changed = hash_blocks([999] + tokens[1:], 16, "m", "")
    assert all(a != b for a, b in zip(base, changed))  # block 0 differs, so every chained hash does
    assert hash_blocks(tokens[:15], 16, "m", "") == []


def test_token_ids_must_fit_uint32_and_block_size_be_positive():
    with pytest.raises(OverflowError):
        hash_blocks([-1] * 16, 16, "m")
    with pytest.raises(ValueError, match="block_size must be positive"):
        hash_blocks([1], 0, "m")


def test_the_cached_hasher_gives_exactly_hash_blocks_answers_across_shared_prefixes_and_evictions():
    rng = random.Random(3)
    hasher = CachedBlockHasher(capacity=3)  # small: generations turn over during the test
    bases = [[rng.randrange(2**32) for _ in range(400)] for _ in range(4)]
    for _ in range(60):
        prompt = rng.choice(bases)[: rng.randrange(0, 400)] + [rng.randrange(2**32) for _ in range(rng.randrange(0, 40))]
        block_size, salts = rng.choice([1, 4, 16]), rng.choice([("m", ""), ("m", "tenant-a"), ("other", "")])
        assert hasher.hash_blocks(prompt, block_size, *salts) == hash_blocks(prompt, block_size, *salts)
    assert len(hasher._runs.new) <= 3 and len(hasher._runs.old) <= 3
    with pytest.raises(ValueError, match="block_size must be positive"):
        hasher.hash_blocks([1, 2], 0, "m")
