"""The checks on pulled KV (dataplane/transport/integrity.py): digests of each block's bytes, and
no NaN or infinity in a tensor pool, with the exact check behind the fast one."""

from __future__ import annotations

import hashlib

import pytest
import torch

from kvplane.dataplane.engines.sim.pool import SimPool
from kvplane.dataplane.transport.integrity import KVIntegrityError, block_digests, check_imported, non_finite_blocks

from .kv_peer import LAYOUT, filled_pool


def test_digests_are_the_sha256_of_each_blocks_bytes_and_a_changed_byte_is_caught():
    pool = filled_pool(LAYOUT, num_blocks=6, seed=3)
    digests = block_digests(pool, [4, 1])
    assert digests == [hashlib.sha256(pool.buffer[b].numpy().tobytes()).digest() for b in (4, 1)]
    check_imported(pool, [4, 1], digests)  # intact: no error
    pool.buffer.view(-1).view(torch.uint8)[1 * LAYOUT.block_nbytes + 17] ^= 1  # one bit of block 1
    with pytest.raises(KVIntegrityError, match="pulled block 1 of 2 does not hash to the digest"):
        check_imported(pool, [4, 1], digests)
    with pytest.raises(KVIntegrityError, match="1 digests for 2 pulled blocks"):
        check_imported(pool, [4, 1], digests[:1])


def test_nan_and_infinity_are_found_and_finite_values_whose_sum_overflows_are_not():
    pool = filled_pool(LAYOUT, num_blocks=6, seed=4)
    pool.buffer[1].view(-1)[5] = float("nan")
    pool.buffer[3].view(-1)[0] = float("-inf")
    pool.buffer[4].fill_(3e38)  # finite, but the block's float32 sum is inf: the exact check clears it
    assert torch.isinf(pool.buffer[4].sum())
    assert non_finite_blocks(pool, [0, 1, 2, 3, 4, 5]) == [1, 3]
    assert non_finite_blocks(pool, [4, 3]) == [1]
    digests = block_digests(pool, [0, 3])
    with pytest.raises(KVIntegrityError, match="1 of 2 pulled blocks hold NaN or infinite values \\(first: block 1\\)"):
        check_imported(pool, [0, 3], digests)  # the digests match: the values alone are refused


def test_a_torch_free_pool_is_checked_by_digest_only():
    pool = SimPool(LAYOUT, num_blocks=4, payload_bytes=64)
    pool.write([b"\xff" * 16, b"\x7f\xc0" * 8], [0, 2])  # bytes that would read as NaN floats
    digests = block_digests(pool, [0, 2])
    assert non_finite_blocks(pool, [0, 2]) == []  # fingerprints, not floats
    check_imported(pool, [0, 2], digests)
    with pytest.raises(KVIntegrityError, match="pulled block 0 of 2"):
        check_imported(pool, [0, 2], digests[::-1])
