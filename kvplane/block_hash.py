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
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    num_blocks = len(token_ids) // block_size
    # Every token packed once (little-endian uint32, as chain_hash does), then hashed block by block.
    packed = array("I", token_ids[: num_blocks * block_size])
    if sys.byteorder != "little":
        packed.byteswap()
    data = memoryview(packed.tobytes())
    step = 4 * block_size
    parent = root_hash(model_salt, tenant_salt)
    hashes: list[BlockHash] = []
    blake2b = hashlib.blake2b
    for offset in range(0, num_blocks * step, step):
        h = blake2b(parent, digest_size=HASH_BYTES)
        h.update(data[offset : offset + step])
        parent = BlockHash(h.digest())
        hashes.append(parent)
    return hashes


class CachedBlockHasher:
    """hash_blocks with a memory of recent blocks: prompts that share a prefix with recent ones
    (a system prompt, the turns of a chat, an agent's loop) hash their shared blocks by one
    dictionary lookup each instead of one blake2b each. Results are exactly hash_blocks': the
    key is the block's whole hash input (parent hash and token bytes). Two generations of at
    most `capacity` blocks each: when the newer one fills, the older is dropped."""

    __slots__ = ("capacity", "_new", "_old")

    def __init__(self, capacity: int = 1 << 15) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._new: dict[bytes, BlockHash] = {}
        self._old: dict[bytes, BlockHash] = {}

    def hash_blocks(self, token_ids: Sequence[int], block_size: int, model_salt: str, tenant_salt: str = "") -> list[BlockHash]:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        num_blocks = len(token_ids) // block_size
        packed = array("I", token_ids[: num_blocks * block_size])
        if sys.byteorder != "little":
            packed.byteswap()
        data = packed.tobytes()
        step = 4 * block_size
        parent = root_hash(model_salt, tenant_salt)
        hashes: list[BlockHash] = []
        new, old, blake2b = self._new, self._old, hashlib.blake2b
        for offset in range(0, num_blocks * step, step):
            key = parent + data[offset : offset + step]  # exactly what chain_hash hashes
            child = new.get(key)
            if child is None:
                child = old.get(key)
                if child is None:
                    child = BlockHash(blake2b(key, digest_size=HASH_BYTES).digest())
                if len(new) >= self.capacity:
                    self._old, self._new = new, {}
                    old, new = self._old, self._new
                new[key] = child
            parent = child
            hashes.append(child)
        return hashes
