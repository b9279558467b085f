"""The gRPC chunk-stream KV transport: always available, no shared memory or RDMA needed.

Server side: the agent's PullKV servicer yields `iter_chunks(...)`: each requested block in
request order, cut into `chunk_bytes` pieces (default 1 MiB), each tagged with the block's index
in the transfer and its byte offset inside the block. Client side: `pull` opens one PullKV
stream (release_after=True, so the peer unpins when the stream completes) and writes each chunk
straight into the destination block's bytes of the local pool; a peer that sends nothing for
`chunk_timeout_s` has stalled and the pull fails (the caller prefills locally). Chunks of a block must arrive in
order and cover it exactly; anything else is a TransferError, never a silently partial block.

Each PullKV presents the ticket of the transfer (PullSource.ticket) over the transport's channel,
made with the worker's credentials (mutual TLS unless the cluster runs --insecure); with TLS the
channel accepts only a peer whose certificate names the worker PullSource.worker_id says.

The descriptor is small JSON (layout, number of pinned blocks, block size in bytes): the block
ids stay on the server, which resolves indices through its pin table.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc

from kvplane.convert import layout_to_pb
from kvplane.dataplane.transport.base import (
    KVPoolLike,
    PullSource,
    TransferError,
    TransportError,
    byte_view,
    check_layout,
    check_pool,
    check_pull_args,
    layout_from_dict,
    layout_to_dict,
)
from kvplane.grpc_util import MAX_MESSAGE_BYTES, aio_channel
from kvplane.security.credentials import Credentials
from kvplane.security.identity import Identity, Role
from kvplane.types import KVLayout
from kvplane.v1 import agent_pb2, agent_pb2_grpc

NAME = "grpc"
DEFAULT_CHUNK_BYTES = 1 << 20
DEFAULT_CHUNK_TIMEOUT_S = 10.0  # progress timeout: the longest wait for the next chunk
# Room for the KVChunk's other fields and framing inside one gRPC message.
_MAX_CHUNK_BYTES = MAX_MESSAGE_BYTES - (1 << 16)


@dataclass(frozen=True, slots=True)
class GrpcDescriptor:
    layout: KVLayout
    num_blocks: int
    block_nbytes: int

    def encode(self) -> bytes:
        return json.dumps(
            {"transport": NAME, "layout": layout_to_dict(self.layout), "num_blocks": self.num_blocks, "block_nbytes": self.block_nbytes},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> GrpcDescriptor:
        try:
            fields = json.loads(data)
            if fields.get("transport") != NAME:
                raise ValueError(f"it was made by the {fields.get('transport')!r} transport")
            return cls(layout_from_dict(fields["layout"]), int(fields["num_blocks"]), int(fields["block_nbytes"]))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise TransportError(f"not a grpc transport descriptor ({e}); did the peer choose another transport?") from None


def iter_chunks(
    pool: KVPoolLike, block_ids: Sequence[int], block_indices: Sequence[int], chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[agent_pb2.KVChunk]:
    """Server side of PullKV: the bytes of block_ids[i] for each i in block_indices, in chunks.

    block_ids are the transfer's pinned blocks in order; block_indices index into them.
    Bytes are read lazily from the pool, so the blocks must stay pinned until the stream ends.
    """
    if not 0 < chunk_bytes <= _MAX_CHUNK_BYTES:
        raise ValueError(f"chunk_bytes must be in 1..{_MAX_CHUNK_BYTES}, got {chunk_bytes}")
    bad = [i for i in block_indices if not 0 <= i < len(block_ids)]
    if bad:
        raise IndexError(f"block indices {bad[:5]} are outside the transfer's {len(block_ids)} blocks")
    block_nbytes = pool.block_nbytes
    flat = byte_view(pool)
    for index in block_indices:
        block_id = block_ids[index]
        block = flat[block_id * block_nbytes : (block_id + 1) * block_nbytes]
        # memoryview slicing is free; tobytes() is the one copy protobuf's bytes field needs.
        block_bytes = block if isinstance(block, memoryview) else memoryview(block.cpu().numpy())
        for offset in range(0, block_nbytes, chunk_bytes):
            yield agent_pb2.KVChunk(block_index=index, offset=offset, data=block_bytes[offset : offset + chunk_bytes].tobytes())


class GrpcStreamTransport:
    """KVTransport over the Agent.PullKV stream; one grpc.aio channel per peer endpoint."""

    name = NAME

    def __init__(
        self, pool: KVPoolLike, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, timeout_s: float | None = 60.0,
        chunk_timeout_s: float = DEFAULT_CHUNK_TIMEOUT_S, credentials: Credentials | None = None,
    ) -> None:  # fmt: skip
        """`credentials`: the worker's own (None: plaintext, for peers started that way, as in tests)."""
        check_pool(pool)
        self._credentials = credentials or Credentials.plaintext(source="grpc transport default")
        if not 0 < chunk_bytes <= _MAX_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be in 1..{_MAX_CHUNK_BYTES}, got {chunk_bytes}")
        self._pool = pool
        self._chunk_bytes = chunk_bytes
        self._timeout_s = timeout_s
        self._chunk_timeout_s = chunk_timeout_s  # a peer that sends no chunk for this long has stalled
        # endpoint -> (event loop, channel, stub): grpc.aio channels belong to the loop that made them.
        self._peers: dict[str, tuple[asyncio.AbstractEventLoop, grpc.aio.Channel, agent_pb2_grpc.AgentStub]] = {}
        self._closed = False

    # -- server side ---------------------------------------------------------------------------

    def describe(self, block_ids: Sequence[int]) -> bytes:
        return GrpcDescriptor(self._pool.layout, len(block_ids), self._pool.block_nbytes).encode()

    # -- client side ---------------------------------------------------------------------------

    async def pull(self, source: PullSource, src_block_indices: Sequence[int], dst_block_ids: Sequence[int]) -> int:
        if self._closed:
            raise TransportError("the grpc transport is closed")
        descriptor = GrpcDescriptor.decode(source.descriptor)
        local = self._pool.layout
        check_layout(local, source.layout)
        check_layout(local, descriptor.layout)
        src_block_indices, dst_block_ids = list(src_block_indices), list(dst_block_ids)
        check_pull_args(self._pool, descriptor.num_blocks, src_block_indices, dst_block_ids)
        if len(set(src_block_indices)) != len(src_block_indices):
            raise ValueError(f"source block indices {src_block_indices[:10]} contain duplicates")
        if not src_block_indices:
            return 0
        block_nbytes = self._pool.block_nbytes
        index_to_dst = dict(zip(src_block_indices, dst_block_ids))
        index_to_received = dict.fromkeys(src_block_indices, 0)
        write = self._writer()
        request = agent_pb2.PullKVRequest(
            transfer_id=source.transfer_id,
            block_indices=src_block_indices,
            layout=layout_to_pb(local),
            chunk_bytes=self._chunk_bytes,
            release_after=True,
        )
        if source.ticket is not None:
            request.ticket.CopyFrom(source.ticket)
        call = self._stub(source.endpoint, source.worker_id).PullKV(request, timeout=self._timeout_s)
        where = f"PullKV of transfer {source.transfer_id} from {source.endpoint}"
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(call.read(), self._chunk_timeout_s)
                except TimeoutError:
                    raise TransferError(f"{where}: no chunk for {self._chunk_timeout_s:g} s; the peer has stalled") from None
                if chunk is grpc.aio.EOF:
                    break
                index = chunk.block_index
                received = index_to_received.get(index)
                if received is None:
                    raise TransferError(f"{where}: the peer sent block index {index}, which was not requested")
                if chunk.offset != received:
                    raise TransferError(f"{where}: block index {index} chunk at offset {chunk.offset}, expected offset {received}")
                data = chunk.data
                end = received + len(data)
                if end > block_nbytes:
                    raise TransferError(f"{where}: block index {index} got {end} bytes, more than the block's {block_nbytes}")
                write(index_to_dst[index] * block_nbytes + received, data)
                index_to_received[index] = end
        except grpc.aio.AioRpcError as e:
            raise TransferError(f"{where} failed: {e.code().name}: {e.details()}") from None
        except BaseException:
            call.cancel()
            raise
        short = [(i, n) for i, n in index_to_received.items() if n != block_nbytes]
        if short:
            listed = ", ".join(f"index {i}: {n} bytes" for i, n in short[:5])
            raise TransferError(f"{where}: the stream ended with {len(short)} blocks short of {block_nbytes} bytes ({listed})")
        return len(src_block_indices) * block_nbytes

    def _writer(self):
        """A function writing bytes at a byte offset of the pool, with one copy on CPU pools."""
        flat = byte_view(self._pool)
        if isinstance(flat, memoryview):
            view = flat

            def write(start: int, data: bytes) -> None:
                view[start : start + len(data)] = data

        else:
            import torch  # noqa: PLC0415 (see byte_view)

            def write(start: int, data: bytes) -> None:
                flat[start : start + len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))

        return write

    def _stub(self, endpoint: str, worker_id: str) -> agent_pb2_grpc.AgentStub:
        loop = asyncio.get_running_loop()
        key = f"{worker_id}@{endpoint}" if worker_id else endpoint  # a TLS channel verifies one peer identity
        peer = self._peers.get(key)
        if peer is not None and peer[0] is loop:
            return peer[2]
        credentials = self._credentials
        if credentials.tls:
            if not worker_id:
                raise TransportError(f"pulling from {endpoint} over TLS needs the peer's worker id, to verify its certificate")
            credentials = credentials.for_peer(Identity(Role.WORKER, worker_id))
        # A channel made on another (finished) loop cannot be used or awaited here: drop it.
        channel = aio_channel(endpoint, credentials)  # traced when tracing is on
        stub = agent_pb2_grpc.AgentStub(channel)
        self._peers[key] = (loop, channel, stub)
        return stub

    @property
    def num_channels(self) -> int:
        return len(self._peers)

    async def aclose(self) -> None:
        """Closes every peer channel that belongs to the running loop; drops the others."""
        self._closed = True
        loop = asyncio.get_running_loop()
        peers, self._peers = self._peers, {}
        await asyncio.gather(*(channel.close() for owner, channel, _ in peers.values() if owner is loop))

    def close(self) -> None:
        """Closes the peer channels; from inside a running loop the closes finish in the background."""
        self._closed = True
        peers, self._peers = self._peers, {}
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for owner, channel, _ in peers.values():
            if owner is running:
                running.create_task(channel.close())
            elif not owner.is_closed() and not owner.is_running():
                owner.run_until_complete(channel.close())
