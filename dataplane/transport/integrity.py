"""What an importer checks about pulled KV blocks before they enter its prefix cache.

Rule: the producing agent sends, in its PrefillResponse (over the mutually authenticated gRPC
channel), the SHA-256 of each pinned block's bytes as they sit in its pool (`block_digests`).
After a pull, and before committing, the importer hashes the bytes that landed in each of its
destination blocks and compares (`check_imported`). So whatever moved the bytes (the PullKV
stream, or a NIXL READ over UCX, which crosses no TLS and names no peer), the blocks committed
are exactly the ones the authenticated producer vouched for. A pool that holds KV as a tensor is
also checked for non-finite values (NaN, inf): no prefill writes them, and attention over them
poisons every later token (issue 28: NaN blocks decoded as zero tokens or failed the request).
A torch-free host pool (the sim engine's) holds fingerprints, not floats: only its digests are
checked. Any failure raises KVIntegrityError naming the first bad block; the caller frees the
blocks and commits none of them.

SHA-256, not BLAKE2: with the SHA extensions most x86 and Arm servers have, OpenSSL's SHA-256 is
the faster of the two in hashlib. The hashing releases the GIL, so callers run these functions
in a worker thread. A device (GPU) pool's blocks are copied to host memory to be hashed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from kvplane.dataplane.transport.base import KVPoolLike, TransferError, byte_view

DIGEST_BYTES = 32


class KVIntegrityError(TransferError):
    """Pulled KV is not what its producer's answer promised, or holds non-finite values."""


def block_digests(pool: KVPoolLike, block_ids: Sequence[int]) -> list[bytes]:
    """The SHA-256 of each block's bytes, in order (producer side: the blocks must stay pinned)."""
    return [hashlib.sha256(block).digest() for block in _blocks(pool, block_ids)]


def check_imported(pool: KVPoolLike, block_ids: Sequence[int], expected_digests: Sequence[bytes]) -> None:
    """Raises KVIntegrityError unless every block's bytes hash to its expected digest and, in a
    tensor pool, every value is finite. block_ids[i] was pulled for expected_digests[i]."""
    if len(block_ids) != len(expected_digests):
        raise KVIntegrityError(f"{len(expected_digests)} digests for {len(block_ids)} pulled blocks")
    for i, (block, expected) in enumerate(zip(_blocks(pool, block_ids), expected_digests)):
        if hashlib.sha256(block).digest() != expected:
            raise KVIntegrityError(
                f"pulled block {i} of {len(block_ids)} does not hash to the digest its producer sent: "
                "the bytes changed on the way, or the producer served other bytes than it vouched for"
            )
    bad = non_finite_blocks(pool, block_ids)
    if bad:
        raise KVIntegrityError(f"{len(bad)} of {len(block_ids)} pulled blocks hold NaN or infinite values (first: block {bad[0]})")


def non_finite_blocks(pool: KVPoolLike, block_ids: Sequence[int]) -> list[int]:
    """Indices into block_ids of the blocks holding a NaN or an infinity; [] for a torch-free pool.

    A block's sum is finite only if all its values are (a NaN or an infinity propagates), so one
    reduction per block clears the usual case; a block whose sum is not finite may only have
    overflowed, and is then checked value by value."""
    buffer = pool.buffer
    if buffer is None or not block_ids:
        return []
    import torch  # noqa: PLC0415 (a tensor pool: its engine loaded torch already)

    sums = torch.stack([buffer[b].sum() for b in block_ids])
    suspects = (~torch.isfinite(sums)).nonzero().flatten().tolist()
    return [i for i in suspects if not bool(torch.isfinite(buffer[block_ids[i]]).all())]


def _blocks(pool: KVPoolLike, block_ids: Sequence[int]):
    """Each block's bytes as a buffer hashlib reads without a copy (device blocks come to the host)."""
    block_nbytes = pool.block_nbytes
    flat = byte_view(pool)
    for b in block_ids:
        if not 0 <= b < pool.num_blocks:
            raise ValueError(f"block id {b} is outside the pool (0..{pool.num_blocks - 1})")
        block = flat[b * block_nbytes : (b + 1) * block_nbytes]
        yield block if isinstance(block, memoryview) else block.cpu().numpy()
