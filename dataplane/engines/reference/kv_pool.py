"""KVPool: one contiguous tensor holding every KV block.

Shape [num_blocks, num_layers, 2 (K, V), block_size, num_kv_heads, head_dim], so block b's bytes
for all layers are the single range [b * block_nbytes, (b + 1) * block_nbytes) of the buffer's
storage: a KV transport moves a block as one piece (one NIXL descriptor, one gRPC chunk run).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvplane.types import KVLayout

TORCH_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


class KVPool:
    __slots__ = ("buffer", "_layout")

    def __init__(self, layout: KVLayout, num_blocks: int, device: torch.device | str = "cpu") -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self._layout = layout
        shape = (num_blocks, layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.head_dim)
        self.buffer = torch.zeros(shape, dtype=TORCH_DTYPES[layout.dtype], device=device)

    @property
    def layout(self) -> KVLayout:
        return self._layout

    @property
    def num_blocks(self) -> int:
        return int(self.buffer.shape[0])

    @property
    def block_nbytes(self) -> int:
        return self._layout.block_nbytes

    @property
    def device(self) -> torch.device:
        return self.buffer.device

    def host_bytes(self) -> memoryview | None:
        """The whole buffer as flat writable bytes when it lives in host memory; None on a GPU."""
        if self.buffer.device.type != "cpu":
            return None
        return memoryview(self.buffer.reshape(-1).view(torch.uint8).numpy())

    @property
    def base_address(self) -> int:
        """Address of block 0 (for registering the pool with a transfer library)."""
        return int(self.buffer.data_ptr())

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_nbytes

    def block_address(self, block_id: int) -> int:
        self._check_ids([block_id])
        return self.base_address + block_id * self.block_nbytes

    def read_blocks(self, block_ids: Sequence[int]) -> torch.Tensor:
        """A copy of the blocks, shape [n, L, 2, bs, H, D], on the pool's device."""
        self._check_ids(block_ids)
        return self.buffer[torch.tensor(list(block_ids), dtype=torch.long, device=self.device)].clone()

    def write_blocks(self, block_ids: Sequence[int], data: torch.Tensor) -> None:
        self._check_ids(block_ids)
        expected = (len(block_ids), *self.buffer.shape[1:])
        if tuple(data.shape) != expected:
            raise ValueError(f"write_blocks got data of shape {tuple(data.shape)}, expected {expected}")
        if data.dtype != self.buffer.dtype:
            raise ValueError(f"write_blocks got dtype {data.dtype}, pool holds {self.buffer.dtype}")
        index = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        self.buffer[index] = data.to(self.device)

    def read_block_bytes(self, block_id: int) -> bytes:
        """The raw bytes of one block (block_nbytes long), for byte-stream transports."""
        self._check_ids([block_id])
        return self.buffer[block_id].contiguous().view(torch.uint8).cpu().numpy().tobytes()

    def write_block_bytes(self, block_id: int, data: bytes | bytearray | memoryview) -> None:
        self._check_ids([block_id])
        if len(data) != self.block_nbytes:
            raise ValueError(f"block {block_id} needs {self.block_nbytes} bytes, got {len(data)}")
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self.buffer[block_id].view(torch.uint8).view(-1).copy_(raw.to(self.device))

    def _check_ids(self, block_ids: Sequence[int]) -> None:
        for b in block_ids:
            if not 0 <= b < self.num_blocks:
                raise IndexError(f"block id {b} is outside the pool (0..{self.num_blocks - 1})")
