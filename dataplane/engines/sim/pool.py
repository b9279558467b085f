"""SimPool: the sim engine's KV pool, plain host memory without torch (a KVPoolLike whose buffer
is None, so the grpc transport serves it).

Each block stores `payload_bytes`, not the model's block bytes: the fingerprint of the block hash
it holds (the hash repeated), written when the block is registered. Transports move these bytes
through their real code path; the importing side checks every pulled block's fingerprint against
the hash it was pulled for, so a transport that delivers the wrong block fails the transfer as a
real corruption would. payload_bytes = 0 keeps no bytes at all (`kvplane sim`, which moves none).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvplane.types import BlockHash, KVLayout


class SimPool:
    __slots__ = ("_layout", "_num_blocks", "_payload", "_data")

    def __init__(self, layout: KVLayout, num_blocks: int, payload_bytes: int) -> None:
        if num_blocks <= 0 or payload_bytes < 0:
            raise ValueError(f"a pool needs num_blocks > 0 and payload_bytes >= 0, got {num_blocks}, {payload_bytes}")
        self._layout = layout
        self._num_blocks = num_blocks
        self._payload = payload_bytes
        self._data = bytearray(num_blocks * payload_bytes)

    @property
    def buffer(self) -> None:
        return None

    def host_bytes(self) -> memoryview:
        return memoryview(self._data)

    @property
    def layout(self) -> KVLayout:
        return self._layout

    @property
    def block_nbytes(self) -> int:
        return self._payload

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    def fingerprint(self, block_hash: BlockHash) -> bytes:
        n = self._payload
        return (block_hash * (n // max(len(block_hash), 1) + 1))[:n]

    def write(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        """The blocks now hold these hashes' KV (the block manager's on_stored hook)."""
        n = self._payload
        if n:
            for h, b in zip(block_hashes, block_ids):
                self._data[b * n : (b + 1) * n] = self.fingerprint(h)

    def corrupt(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> list[int]:
        """Indices of the blocks whose bytes are not their hash's fingerprint."""
        n = self._payload
        if not n:
            return []
        return [i for i, (h, b) in enumerate(zip(block_hashes, block_ids)) if self._data[b * n : (b + 1) * n] != self.fingerprint(h)]
