"""KVPool: one contiguous buffer, block b at bytes [b * block_nbytes, (b + 1) * block_nbytes)."""

from __future__ import annotations

import pytest
import torch

from kvplane.dataplane.engines.reference.kv_pool import KVPool
from kvplane.types import KVLayout

LAYOUT = KVLayout("m", num_layers=2, num_kv_heads=2, head_dim=4, dtype="float32", block_size=3)


def test_shape_layout_and_byte_geometry() -> None:
    pool = KVPool(LAYOUT, num_blocks=5)
    assert pool.buffer.shape == (5, 2, 2, 3, 2, 4)
    assert pool.buffer.is_contiguous()
    assert pool.layout == LAYOUT
    assert pool.num_blocks == 5
    assert pool.block_nbytes == 2 * 2 * 3 * 2 * 4 * 4 == LAYOUT.block_nbytes
    assert pool.nbytes == 5 * pool.block_nbytes
    assert pool.block_address(3) - pool.base_address == 3 * pool.block_nbytes


def test_a_block_is_one_contiguous_byte_range() -> None:
    pool = KVPool(LAYOUT, num_blocks=4)
    pool.buffer[2] = torch.arange(pool.buffer[2].numel(), dtype=torch.float32).view(pool.buffer[2].shape)
    flat = pool.buffer.view(torch.uint8).view(-1)
    start = 2 * pool.block_nbytes
    assert bytes(flat[start : start + pool.block_nbytes].numpy()) == pool.read_block_bytes(2)
    assert torch.count_nonzero(flat[:start]) == 0 and torch.count_nonzero(flat[start + pool.block_nbytes :]) == 0


def test_read_and_write_blocks_copy() -> None:
    pool = KVPool(LAYOUT, num_blocks=4)
    data = torch.randn((2, 2, 2, 3, 2, 4), generator=torch.Generator().manual_seed(0))
    pool.write_blocks([3, 1], data)
    got = pool.read_blocks([1, 3])
    assert torch.equal(got[0], data[1]) and torch.equal(got[1], data[0])
    got.zero_()  # a copy: the pool is untouched
    assert torch.equal(pool.read_blocks([3])[0], data[0])
    assert torch.count_nonzero(pool.read_blocks([0, 2])) == 0


def test_block_bytes_round_trip_between_pools() -> None:
    src, dst = KVPool(LAYOUT, 3), KVPool(LAYOUT, 3)
    src.write_blocks([1], torch.randn((1, 2, 2, 3, 2, 4), generator=torch.Generator().manual_seed(1)))
    dst.write_block_bytes(2, src.read_block_bytes(1))
    assert torch.equal(dst.buffer[2], src.buffer[1])
    with pytest.raises(ValueError, match=f"block 0 needs {src.block_nbytes} bytes, got 3"):
        dst.write_block_bytes(0, b"abc")


def test_bad_ids_shapes_and_dtypes_are_refused() -> None:
    pool = KVPool(LAYOUT, num_blocks=2)
    with pytest.raises(IndexError, match="block id 2 is outside the pool \\(0..1\\)"):
        pool.read_blocks([0, 2])
    with pytest.raises(ValueError, match="expected \\(1, 2, 2, 3, 2, 4\\)"):
        pool.write_blocks([0], torch.zeros(1, 2, 2, 3, 2, 5))
    with pytest.raises(ValueError, match="pool holds torch.float32"):
        pool.write_blocks([0], torch.zeros((1, 2, 2, 3, 2, 4), dtype=torch.float16))
    with pytest.raises(ValueError, match="num_blocks must be positive"):
        KVPool(LAYOUT, 0)


def test_half_precision_pool() -> None:
    layout = KVLayout("m", 1, 1, 2, "bfloat16", 2)
    pool = KVPool(layout, 2)
    assert pool.buffer.dtype == torch.bfloat16 and pool.block_nbytes == 2 * 1 * 1 * 2 * 2 * 2
    pool.buffer[1] = 1.5
    other = KVPool(layout, 2)
    other.write_block_bytes(0, pool.read_block_bytes(1))
    assert torch.equal(other.buffer[0], pool.buffer[1])
