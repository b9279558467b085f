"""The prefill side of a transfer: layout checks, pins held until pulled, released on completion,
failure or timeout. A real Agent service over loopback gRPC with a real engine; the test plays the
control plane (it holds the ticket key) and the decode agent."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import grpc
import pytest

from dataplane.agent.config import AgentConfig
from dataplane.agent.service import AgentService
from dataplane.engine import Engine, EngineConfig
from dataplane.transport import make_transport
from kvplane import tickets
from kvplane.convert import layout_to_pb
from kvplane.grpc_util import aio_channel, make_server
from kvplane.types import Role
from kvplane.v1 import agent_pb2, agent_pb2_grpc

KEY = b"test-ticket-key"
PROMPT = list(range(1, 16 * 4 + 5))  # four full blocks and a tail


@contextlib.asynccontextmanager
async def prefill_agent(pin_timeout_s: float = 30.0):
    engine = Engine(EngineConfig(num_blocks=64))
    engine.start()
    config = AgentConfig(worker_id="prefill-t", role=Role.PREFILL, pin_timeout_s=pin_timeout_s).validate()
    server = make_server()
    port = server.add_insecure_port("127.0.0.1:0")
    transports = {"grpc": make_transport("grpc", engine.pool, agent_name=config.worker_id)}
    service = AgentService(config, engine, transports, lambda: KEY, f"127.0.0.1:{port}")
    agent_pb2_grpc.add_AgentServicer_to_server(service, server)
    await server.start()
    service.start()
    channel = aio_channel(f"127.0.0.1:{port}")
    try:
        yield engine, agent_pb2_grpc.AgentStub(channel)
    finally:
        await channel.close()
        await server.stop(0)
        await service.close()
        engine.stop()


def prefill_request(engine, **overrides) -> agent_pb2.PrefillRequest:
    request = agent_pb2.PrefillRequest(
        ticket=tickets.issue(KEY, "r1", "decode-t", "prefill-t"),
        request_id="r1",
        prompt_token_ids=PROMPT,
        layout=layout_to_pb(engine.layout),
        transports=["grpc"],
    )
    for name, value in overrides.items():
        getattr(request, name).CopyFrom(value)  # message fields only: layout, ticket
    return request


def num_pinned(engine) -> int:
    load = engine.load()
    return load.num_used_blocks


def test_pull_with_release_after_unpins_when_the_stream_ends():
    async def body():
        async with prefill_agent() as (engine, stub):
            reply = await stub.Prefill(prefill_request(engine))
            assert len(reply.block_hashes) == 4 and reply.transport == "grpc"
            assert num_pinned(engine) == 4
            chunks = [c async for c in stub.PullKV(agent_pb2.PullKVRequest(
                transfer_id=reply.transfer_id, block_indices=[1, 3], layout=layout_to_pb(engine.layout), release_after=True))]  # fmt: skip
            assert {c.block_index for c in chunks} == {1, 3}
            assert sum(len(c.data) for c in chunks) == 2 * engine.pool.block_nbytes
            assert num_pinned(engine) == 0
            assert (await stub.ReleaseKV(agent_pb2.ReleaseKVRequest(transfer_id=reply.transfer_id))).released is False

    asyncio.run(body())


def test_unpulled_transfer_is_unpinned_after_the_timeout():
    async def body():
        async with prefill_agent(pin_timeout_s=0.3) as (engine, stub):
            reply = await stub.Prefill(prefill_request(engine))
            assert num_pinned(engine) == 4
            await asyncio.sleep(1.6)  # the janitor runs every second
            assert num_pinned(engine) == 0
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.PullKV(agent_pb2.PullKVRequest(transfer_id=reply.transfer_id, layout=layout_to_pb(engine.layout))):
                    pass
            assert info.value.code() == grpc.StatusCode.NOT_FOUND

    asyncio.run(body())


@pytest.mark.parametrize("field, value", [("dtype", "bfloat16"), ("block_size", 32), ("num_kv_heads", 4), ("model", "other")])
def test_layout_mismatch_is_refused_before_any_work(field, value):
    async def body():
        async with prefill_agent() as (engine, stub):
            theirs = layout_to_pb(dataclasses.replace(engine.layout, **{field: value}))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Prefill(prefill_request(engine, layout=theirs))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"KV layout mismatch on {field}" in info.value.details()
            assert engine.load().num_cached_blocks == 0  # nothing was prefilled
            # A pull whose layout differs is refused too, and releases the transfer.
            reply = await stub.Prefill(prefill_request(engine))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.PullKV(agent_pb2.PullKVRequest(transfer_id=reply.transfer_id, layout=theirs)):
                    pass
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert num_pinned(engine) == 0

    asyncio.run(body())


def test_requests_need_a_valid_ticket():
    async def body():
        async with prefill_agent() as (engine, stub):
            for ticket, words in [
                (tickets.issue(b"another-cluster", "r1", "decode-t", "prefill-t"), "does not verify"),
                (tickets.issue(KEY, "r1", "decode-t", "someone-else"), "not 'prefill-t'"),
                (tickets.issue(KEY, "r1", "decode-t", "prefill-t", ttl_s=-1), "expired"),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Prefill(prefill_request(engine, ticket=ticket))
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert words in info.value.details()

    asyncio.run(body())
