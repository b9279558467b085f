"""gRPC chunk-stream transport: iter_chunks framing, pulls from a real peer process, errors."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import numpy as np
import pytest
import torch

from kvplane.dataplane.transport import LayoutMismatchError, PullSource, TransferError, TransportError
from kvplane.dataplane.transport.grpc_stream import GrpcDescriptor, GrpcStreamTransport, iter_chunks
from kvplane.dataplane.transport.nixl_descriptor import NixlDescriptor
from kvplane.grpc_util import make_server
from kvplane.v1 import agent_pb2, agent_pb2_grpc

from .kv_peer import LAYOUT, assert_pulled, empty_pool, filled_pool

BLOCK_NBYTES = LAYOUT.block_nbytes  # 2048


def source_for(peer, transfer_id: str, layout=LAYOUT) -> PullSource:
    return PullSource(endpoint=peer.endpoint, transfer_id=transfer_id, descriptor=peer.descriptor, layout=layout)


# -- server side ---------------------------------------------------------------------------------


def test_iter_chunks_cuts_each_requested_block_into_ordered_chunks():
    pool = filled_pool(LAYOUT, num_blocks=6, seed=3)
    chunks = list(iter_chunks(pool, block_ids=[4, 0, 2], block_indices=[2, 0], chunk_bytes=900))
    assert [(c.block_index, c.offset, len(c.data)) for c in chunks] == [
        (2, 0, 900),
        (2, 900, 900),
        (2, 1800, 248),
        (0, 0, 900),
        (0, 900, 900),
        (0, 1800, 248),
    ]
    block_2 = b"".join(c.data for c in chunks[:3])
    block_4 = b"".join(c.data for c in chunks[3:])
    assert block_2 == pool.buffer[2].numpy().tobytes()
    assert block_4 == pool.buffer[4].numpy().tobytes()


def test_iter_chunks_sends_a_small_block_as_one_chunk():
    pool = filled_pool(LAYOUT, num_blocks=2, seed=3)
    chunks = list(iter_chunks(pool, [1], [0]))
    assert [(c.block_index, c.offset, c.data) for c in chunks] == [(0, 0, pool.buffer[1].numpy().tobytes())]


def test_iter_chunks_refuses_bad_indices_and_chunk_sizes():
    pool = filled_pool(LAYOUT, num_blocks=2, seed=3)
    with pytest.raises(IndexError, match=r"block indices \[2\] are outside the transfer's 2 blocks"):
        list(iter_chunks(pool, [0, 1], [0, 2]))
    with pytest.raises(ValueError, match="chunk_bytes must be in 1.."):
        list(iter_chunks(pool, [0, 1], [0], chunk_bytes=0))


def test_descriptor_round_trips_and_rejects_foreign_bytes():
    transport = GrpcStreamTransport(empty_pool(LAYOUT, 4))
    descriptor = GrpcDescriptor.decode(transport.describe([3, 1, 2]))
    assert descriptor == GrpcDescriptor(LAYOUT, num_blocks=3, block_nbytes=BLOCK_NBYTES)
    nixl_bytes = NixlDescriptor("a", b"md", LAYOUT, "DRAM", np.zeros((0, 3), dtype=np.uint64)).encode()
    with pytest.raises(TransportError, match="not a grpc transport descriptor"):
        GrpcDescriptor.decode(nixl_bytes)


# -- client side against a real peer process -----------------------------------------------------


def test_pull_copies_a_non_contiguous_selection_into_other_block_ids(grpc_peer):
    local = empty_pool(LAYOUT, num_blocks=16)
    src, dst = [5, 1, 2, 3, 0], [0, 8, 9, 10, 2]

    async def run():
        transport = GrpcStreamTransport(local, chunk_bytes=700)  # 3 uneven chunks per block
        try:
            return await transport.pull(source_for(grpc_peer, "t0"), src, dst)
        finally:
            await transport.aclose()

    assert asyncio.run(run()) == 5 * BLOCK_NBYTES
    assert_pulled(local, grpc_peer, src, dst)


def test_pull_reuses_one_channel_per_peer_and_releases_after_streaming(grpc_peer):
    local = empty_pool(LAYOUT, num_blocks=16)

    async def run():
        transport = GrpcStreamTransport(local)
        try:
            first = await transport.pull(source_for(grpc_peer, "t1"), [4], [15])
            second = await transport.pull(source_for(grpc_peer, "t2"), [0, 5], [3, 4])
            channels = transport.num_channels
            async with grpc.aio.insecure_channel(grpc_peer.endpoint) as channel:
                release = await agent_pb2_grpc.AgentStub(channel).ReleaseKV(agent_pb2.ReleaseKVRequest(transfer_id="t1"))
                again = transport.pull(source_for(grpc_peer, "t1"), [4], [14])
                with pytest.raises(TransferError, match="PullKV of transfer t1 from .* failed: NOT_FOUND: unknown transfer 't1'"):
                    await again
            return first, second, channels, release.released
        finally:
            await transport.aclose()

    first, second, channels, released = asyncio.run(run())
    assert (first, second, channels, released) == (BLOCK_NBYTES, 2 * BLOCK_NBYTES, 1, False)
    assert_pulled(local, grpc_peer, [4, 0, 5], [15, 3, 4])


def test_empty_pull_moves_nothing(grpc_peer):
    local = empty_pool(LAYOUT, num_blocks=4)

    async def run():
        transport = GrpcStreamTransport(local)
        try:
            return await transport.pull(source_for(grpc_peer, "t3"), [], [])
        finally:
            await transport.aclose()

    assert asyncio.run(run()) == 0
    assert torch.count_nonzero(local.buffer).item() == 0


def test_close_inside_the_event_loop_closes_peer_channels(grpc_peer):
    local = empty_pool(LAYOUT, num_blocks=4)

    async def run():
        transport = GrpcStreamTransport(local)
        await transport.pull(source_for(grpc_peer, "t3"), [1], [0])
        channel = transport._peers[grpc_peer.endpoint][1]
        transport.close()  # what the agent does during its async shutdown
        await asyncio.sleep(0.05)
        return transport.num_channels, channel.get_state()

    assert asyncio.run(run()) == (0, grpc.ChannelConnectivity.SHUTDOWN)
    assert_pulled(local, grpc_peer, [1], [0])


# -- refusals before any byte moves --------------------------------------------------------------


def test_pull_refuses_a_source_layout_that_differs():
    transport = GrpcStreamTransport(empty_pool(LAYOUT, 4))
    other = dataclasses.replace(LAYOUT, head_dim=32)
    descriptor = GrpcStreamTransport(empty_pool(LAYOUT, 4)).describe([0, 1])
    source = PullSource("127.0.0.1:1", "t", descriptor, other)
    with pytest.raises(LayoutMismatchError) as info:
        asyncio.run(transport.pull(source, [0], [0]))
    assert str(info.value) == "KV layout mismatch on head_dim: this side has 16, peer has 32"


def test_pull_refuses_a_descriptor_whose_layout_differs():
    other = dataclasses.replace(LAYOUT, dtype="float16")
    descriptor = GrpcStreamTransport(empty_pool(other, 4)).describe([0, 1])
    transport = GrpcStreamTransport(empty_pool(LAYOUT, 4))
    with pytest.raises(LayoutMismatchError) as info:
        asyncio.run(transport.pull(PullSource("127.0.0.1:1", "t", descriptor, LAYOUT), [0], [0]))
    assert str(info.value) == "KV layout mismatch on dtype: this side has 'float32', peer has 'float16'"


@pytest.mark.parametrize(
    ("src", "dst", "message"),
    [
        ([0, 1], [0], "pull got 2 source block indices but 1 destination block ids"),
        ([0, 2], [0, 1], r"source block indices \[2\] are outside the transfer's 2 blocks"),
        ([0], [4], r"destination block ids \[4\] are outside the local pool \(0..3\)"),
        ([0, 1], [3, 3], r"destination block ids \[3, 3\] contain duplicates"),
        ([1, 1], [2, 3], r"source block indices \[1, 1\] contain duplicates"),
    ],
)
def test_pull_refuses_bad_block_arguments(src, dst, message):
    descriptor = GrpcStreamTransport(empty_pool(LAYOUT, 4)).describe([0, 1])
    transport = GrpcStreamTransport(empty_pool(LAYOUT, 4))
    with pytest.raises(ValueError, match=message):
        asyncio.run(transport.pull(PullSource("127.0.0.1:1", "t", descriptor, LAYOUT), src, dst))


# -- a peer that breaks the protocol -------------------------------------------------------------


class BrokenServicer(agent_pb2_grpc.AgentServicer):
    """Speaks PullKV but misbehaves in the way the transfer id names."""

    async def PullKV(self, request, context):
        index = request.block_indices[0]
        if request.transfer_id == "short":
            yield agent_pb2.KVChunk(block_index=index, offset=0, data=b"\x01" * 100)
        elif request.transfer_id == "gap":
            yield agent_pb2.KVChunk(block_index=index, offset=0, data=b"\x01" * 100)
            yield agent_pb2.KVChunk(block_index=index, offset=200, data=b"\x01" * 100)
        elif request.transfer_id == "stranger":
            yield agent_pb2.KVChunk(block_index=index + 1, offset=0, data=b"\x01" * 100)
        elif request.transfer_id == "overflow":
            yield agent_pb2.KVChunk(block_index=index, offset=0, data=b"\x01" * (BLOCK_NBYTES + 1))


@pytest.mark.parametrize(
    ("transfer_id", "message"),
    [
        ("short", r"the stream ended with 1 blocks short of 2048 bytes \(index 0: 100 bytes\)"),
        ("gap", "block index 0 chunk at offset 200, expected offset 100"),
        ("stranger", "the peer sent block index 1, which was not requested"),
        ("overflow", "block index 0 got 2049 bytes, more than the block's 2048"),
    ],
)
def test_pull_rejects_missing_or_misplaced_data(transfer_id, message):
    async def run():
        server = make_server()
        agent_pb2_grpc.add_AgentServicer_to_server(BrokenServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        transport = GrpcStreamTransport(empty_pool(LAYOUT, 4))
        descriptor = transport.describe([0, 1])
        try:
            await transport.pull(PullSource(f"127.0.0.1:{port}", transfer_id, descriptor, LAYOUT), [0], [2])
        finally:
            await transport.aclose()
            await server.stop(0)

    with pytest.raises(TransferError, match=f"PullKV of transfer {transfer_id} from 127.0.0.1:\\d+: {message}"):
        asyncio.run(run())


def test_closed_transport_refuses_to_pull():
    transport = GrpcStreamTransport(empty_pool(LAYOUT, 4))
    descriptor = transport.describe([0])
    transport.close()
    with pytest.raises(TransportError, match="the grpc transport is closed"):
        asyncio.run(transport.pull(PullSource("127.0.0.1:1", "t", descriptor, LAYOUT), [0], [0]))
