"""Chained block hashes: the cache key shared by the engine's prefix cache and the router's index.

Rule: split the token ids into full blocks of `block_size`; block i's hash is
blake2b-128(parent_hash || block token ids as little-endian uint32), where block 0's parent is
blake2b-128("kvplane-v1" || model salt || tenant salt). A partial tail block is never hashed.
Equal hashes therefore mean an equal model, tenant and entire token prefix (after vLLM's
chained hashes with extra keys; a collision-resistant hash because a collision would serve
another prompt's KV).
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Sequence

from kvplane.types import BlockHash

HASH_BYTES = 16


def root_hash(model_salt: str, tenant_salt: str = "") -> BlockHash:
    h = hashlib.blake2b(digest_size=HASH_BYTES)
    h.update(b"kvplane-v1\x00")
    h.update(model_salt.encode())
    h.update(b"\x00")
    h.update(tenant_salt.encode())
    return BlockHash(h.digest())


def chain_hash(parent: BlockHash, block_token_ids: Sequence[int]) -> BlockHash:
    h = hashlib.blake2b(parent, digest_size=HASH_BYTES)
    h.update(struct.pack(f"<{len(block_token_ids)}I", *block_token_ids))
    return BlockHash(h.digest())


def hash_blocks(token_ids: Sequence[int], block_size: int, model_salt: str, tenant_salt: str = "") -> list[BlockHash]:
    """Hashes of every full block of `token_ids`, each chained on all blocks before it."""
    data = _packed(token_ids, block_size)
    return list(_chain(root_hash(model_salt, tenant_salt), data, 0, len(data), 4 * block_size))


def _packed(token_ids: Sequence[int], block_size: int) -> bytes:
    """The tokens of every full block, packed once (little-endian uint32, as chain_hash does)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    count = len(token_ids) // block_size * block_size
    packed = array("I", token_ids[:count])
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


class _Recent:
    """A map that remembers about the last `capacity` to 2 x `capacity` entries put: two
    generations, the older dropped whole when the newer fills (O(1), no per-entry bookkeeping)."""

    __slots__ = ("capacity", "new", "old")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.new: dict = {}
        self.old: dict = {}

    def get(self, key):
        value = self.new.get(key)
        if value is None:
            value = self.old.get(key)
            if value is not None:
                self.put(key, value)
        return value

    def put(self, key, value) -> None:
        if len(self.new) >= self.capacity:
            self.old, self.new = self.new, {}
        self.new[key] = value


class CachedBlockHasher:
    """hash_blocks with a memory of recent prompts: a prompt that shares a prefix with recent ones
    (a system prompt, the turns of a chat, an agent's loop) gets the hashes of each shared run of
    RUN_BLOCKS blocks by one dictionary lookup instead of one blake2b per block. Results are
    exactly hash_blocks': a run's key is its whole hash input (the parent hash and the run's token
    bytes). After the first run that misses no later one can hit (its last hash is new and the
    next run's parent), so a prompt of new blocks costs hash_blocks plus one store per run. The
    partial run at a prompt's end is not cached. Memory: about `capacity` runs per generation,
    two generations."""

    RUN_BLOCKS = 16

    __slots__ = ("_runs",)

    def __init__(self, capacity: int = 1 << 11) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self._runs = _Recent(capacity)

    def hash_blocks(self, token_ids: Sequence[int], block_size: int, model_salt: str, tenant_salt: str = "") -> list[BlockHash]:
        data = _packed(token_ids, block_size)
        step, end = 4 * block_size, len(data)
        run_bytes = step * self.RUN_BLOCKS
        parent = root_hash(model_salt, tenant_salt)
        hashes: list[BlockHash] = []
        offset, known = 0, True  # known: every run so far was in the cache
        while offset + run_bytes <= end:
            key = parent + data[offset : offset + run_bytes]
            run = self._runs.get(key) if known else None
            if run is None:
                known = False
                run = _chain(parent, data, offset, offset + run_bytes, step)
                self._runs.put(key, run)
            hashes += run
            parent, offset = run[-1], offset + run_bytes
        if offset < end:
            hashes += _chain(parent, data, offset, end, step)
        return hashes


def _chain(parent: BlockHash, data: bytes, start: int, end: int, step: int) -> tuple[BlockHash, ...]:
    """The chained hashes of the blocks of data[start:end], `step` bytes each, after `parent`."""
    blake2b = hashlib.blake2b
    out = []
    for offset in range(start, end, step):
        parent = BlockHash(blake2b(parent + data[offset : offset + step], digest_size=HASH_BYTES).digest())
        out.append(parent)
    return tuple(out)
