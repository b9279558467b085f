"""The KV transport seam: what a pool must offer, what a transport does, and the errors it raises.

A transfer has two sides. The prefill (server) side pins blocks and calls `describe(block_ids)`;
the bytes go to the decode side in PrefillResponse.transport_descriptor. The decode (client)
side calls `pull(source, src_block_indices, dst_block_ids)`, where each source index points
into the pinned block list the descriptor was made from and each destination is a block id of
the local pool. Blocks are single contiguous byte ranges of the pool buffer, so a transport
moves whole blocks and never looks inside them.

No module here imports torch when imported (an agent beside an external engine loads none). A
pool is either a torch tensor (the reference engine's KVPool: every transport) or plain host
memory without torch (the sim engine's pool: `buffer` is None, and only byte-stream transports,
grpc, serve it). Code that touches a tensor imports torch where it runs. The nixl package itself
imports torch, so the NIXL probe only runs when a tensor pool is there to serve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kvplane.types import KVLayout

if TYPE_CHECKING:
    import torch


class TransportError(RuntimeError):
    """A KV transfer could not be set up or did not complete."""


class TransportUnavailableError(TransportError):
    """The named transport cannot run in this process (library missing, backend failed)."""


class LayoutMismatchError(TransportError):
    """The two pools disagree on the KV layout; the message names the first differing field."""


class TransferError(TransportError):
    """Bytes did not arrive as promised: peer error, missing or short data, library failure."""


class KVPoolLike(Protocol):
    """The part of a KV pool a transport needs (dataplane.engines.reference.kv_pool.KVPool and
    dataplane.engines.sim.pool.SimPool satisfy it)."""

    @property
    def buffer(self) -> torch.Tensor | None:
        """[num_blocks, layers, 2, block_size, heads, head_dim], contiguous; None for a torch-free
        host pool (then host_bytes() is the pool)."""
        ...

    def host_bytes(self) -> memoryview | None:
        """The whole pool as one flat writable byte view when it lives in host memory (no copy);
        None for device memory."""
        ...

    @property
    def layout(self) -> KVLayout: ...
    @property
    def block_nbytes(self) -> int:
        """Bytes stored per block: the layout's block bytes, or a simulated engine's scaled-down payload."""
        ...

    @property
    def num_blocks(self) -> int: ...


@dataclass(frozen=True, slots=True)
class PullSource:
    """Where a decode worker pulls from: the prefill agent and its PrefillResponse fields."""

    endpoint: str  # peer agent host:port
    transfer_id: str
    descriptor: bytes  # PrefillResponse.transport_descriptor
    layout: KVLayout  # the layout the peer announced (PrefillResponse.layout)
    # The control plane's ticket the transfer was prefilled under (a kvplane.v1 Ticket): the grpc
    # transport presents it with each pull. NIXL reads go through UCX, which carries no ticket.
    ticket: object | None = None
    # The peer's worker id (the ticket's prefill_worker_id): with mutual TLS the grpc transport
    # accepts the peer only when its certificate names that worker (Credentials.for_peer).
    worker_id: str = ""


@runtime_checkable
class KVTransport(Protocol):
    name: str

    def describe(self, block_ids: Sequence[int]) -> bytes:
        """Server side: a descriptor of the pinned blocks, in order, for PrefillResponse."""
        ...

    async def pull(self, source: PullSource, src_block_indices: Sequence[int], dst_block_ids: Sequence[int]) -> int:
        """Client side: copies source blocks into local blocks; returns the number of bytes moved."""
        ...

    def close(self) -> None: ...


def check_layout(local: KVLayout, remote: KVLayout) -> None:
    mismatch = local.mismatch(remote)
    if mismatch is not None:
        raise LayoutMismatchError(mismatch)


def check_pool(pool: KVPoolLike) -> None:
    """A transport addresses blocks by byte offset, so the buffer must be one dense block array."""
    buffer = pool.buffer
    if buffer is None:
        host = pool.host_bytes()
        if host is None or host.nbytes != pool.num_blocks * pool.block_nbytes:
            raise ValueError(f"a pool without a tensor must be {pool.num_blocks} blocks of {pool.block_nbytes} bytes in host memory")
        return
    if not buffer.is_contiguous():
        raise ValueError("the KV pool buffer must be contiguous: transports address blocks by byte offset")
    if buffer.shape[0] != pool.num_blocks or buffer.numel() * buffer.element_size() != pool.num_blocks * pool.block_nbytes:
        raise ValueError(
            f"the KV pool buffer ({tuple(buffer.shape)}, {buffer.dtype}) is not {pool.num_blocks} blocks of {pool.block_nbytes} bytes"
        )


def check_pull_args(pool: KVPoolLike, num_src_blocks: int, src_block_indices: Sequence[int], dst_block_ids: Sequence[int]) -> None:
    """Refuses a pull that would read outside the transfer or write outside / twice into the pool."""
    if len(src_block_indices) != len(dst_block_ids):
        raise ValueError(f"pull got {len(src_block_indices)} source block indices but {len(dst_block_ids)} destination block ids")
    bad_src = [i for i in src_block_indices if not 0 <= i < num_src_blocks]
    if bad_src:
        raise ValueError(f"source block indices {bad_src[:5]} are outside the transfer's {num_src_blocks} blocks")
    bad_dst = [b for b in dst_block_ids if not 0 <= b < pool.num_blocks]
    if bad_dst:
        raise ValueError(f"destination block ids {bad_dst[:5]} are outside the local pool (0..{pool.num_blocks - 1})")
    if len(set(dst_block_ids)) != len(dst_block_ids):
        raise ValueError(f"destination block ids {list(dst_block_ids)[:10]} contain duplicates")


def byte_view(pool: KVPoolLike) -> memoryview | torch.Tensor:
    """The pool's storage as flat bytes (a view, not a copy): a memoryview of host memory, else a
    uint8 tensor on the pool's device."""
    host = pool.host_bytes()
    if host is not None:
        return host
    import torch  # noqa: PLC0415 (only with a device pool, whose engine has loaded torch already)

    return pool.buffer.reshape(-1).view(torch.uint8)


def layout_to_dict(layout: KVLayout) -> dict:
    return dataclasses.asdict(layout)


def layout_from_dict(data: dict) -> KVLayout:
    return KVLayout(**data)
