"""The prefill side of a transfer: layout checks, pins held until pulled, released on completion,
failure or timeout. A real Agent service over loopback gRPC with a real engine; the test plays the
control plane (it holds the ticket-signing key) and the decode agent."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

import grpc
import pytest

from kvplane import tickets
from kvplane.controlplane.core.failover import Failure, classify
from kvplane.convert import layout_to_pb
from kvplane.types import Role
from kvplane.v1 import agent_pb2, common_pb2

from .helpers import SIGNER, ManualClock, generate_ticket, serve_agent, wait_until

PROMPT = list(range(1, 16 * 4 + 5))  # four full blocks and a tail


@contextlib.asynccontextmanager
async def prefill_agent(**overrides):
    async with serve_agent("prefill-t", Role.PREFILL, **overrides) as agent:
        yield agent.engine, agent.stub


def prefill_request(engine, now: float | None = None, **overrides) -> agent_pb2.PrefillRequest:
    request = agent_pb2.PrefillRequest(
        ticket=generate_ticket("r1", "decode-t", "prefill-t", PROMPT, now=now),
        request_id="r1",
        prompt_token_ids=PROMPT,
        layout=layout_to_pb(engine.info.layout),
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
            prefill = prefill_request(engine)
            reply = await stub.Prefill(prefill)
            assert len(reply.block_hashes) == 4 and reply.transport == "grpc"
            assert num_pinned(engine) == 4
            chunks = [c async for c in stub.PullKV(agent_pb2.PullKVRequest(
                transfer_id=reply.transfer_id, block_indices=[1, 3], layout=layout_to_pb(engine.info.layout), release_after=True,
                ticket=prefill.ticket))]  # fmt: skip
            assert {c.block_index for c in chunks} == {1, 3}
            assert sum(len(c.data) for c in chunks) == 2 * engine.kv_transfer.pool.block_nbytes
            assert num_pinned(engine) == 0
            release = agent_pb2.ReleaseKVRequest(transfer_id=reply.transfer_id, ticket=prefill.ticket)
            assert (await stub.ReleaseKV(release)).released is False

    asyncio.run(body())


def test_unpulled_transfer_is_unpinned_after_the_timeout():
    clock = ManualClock()

    async def body():
        async with serve_agent("prefill-t", Role.PREFILL, clock=clock, pin_timeout_s=30.0, pin_check_interval_s=0.01) as agent:
            engine, stub = agent.engine, agent.stub
            prefill = prefill_request(engine, now=clock.now)
            reply = await stub.Prefill(prefill)
            assert reply.expires_at == clock.now + 30.0
            assert num_pinned(engine) == 4
            clock.now += 30.0  # due, not yet past due: the janitor keeps it
            assert agent.service.expire_pins() == []
            assert num_pinned(engine) == 4
            clock.now += 0.5
            await wait_until(lambda: num_pinned(engine) == 0, "the janitor has unpinned the expired transfer")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                pull = agent_pb2.PullKVRequest(
                    transfer_id=reply.transfer_id, layout=layout_to_pb(engine.info.layout), ticket=prefill.ticket
                )
                async for _ in stub.PullKV(pull):
                    pass
            assert info.value.code() == grpc.StatusCode.NOT_FOUND

    asyncio.run(body())


@pytest.mark.parametrize("field, value", [("dtype", "bfloat16"), ("block_size", 32), ("num_kv_heads", 4), ("model", "other")])
def test_layout_mismatch_is_refused_before_any_work(field, value):
    async def body():
        async with prefill_agent() as (engine, stub):
            theirs = layout_to_pb(dataclasses.replace(engine.info.layout, **{field: value}))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Prefill(prefill_request(engine, layout=theirs))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"KV layout mismatch on {field}" in info.value.details()
            assert engine.load().num_cached_blocks == 0  # nothing was prefilled
            # A pull whose layout differs is refused too, and releases the transfer.
            prefill = prefill_request(engine)
            reply = await stub.Prefill(prefill)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.PullKV(agent_pb2.PullKVRequest(transfer_id=reply.transfer_id, layout=theirs, ticket=prefill.ticket)):
                    pass
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert num_pinned(engine) == 0

    asyncio.run(body())


def test_requests_need_a_valid_ticket():
    async def body():
        async with prefill_agent() as (engine, stub):
            other_cluster = tickets.TicketSigner(tickets.new_signing_key())
            forged_lifetime = generate_ticket("r1", "decode-t", "prefill-t", PROMPT)
            forged_lifetime.expires_at += 31 * 365 * 86400  # the signature no longer covers it
            for ticket, words in [
                (common_pb2.Ticket(), "carries no ticket"),
                (
                    other_cluster.issue(
                        tickets.GENERATE, "decode-t", request_id="r1", prefill_worker_id="prefill-t", prompt_token_ids=PROMPT
                    ),
                    "does not verify",
                ),  # fmt: skip
                (forged_lifetime, "does not verify"),
                (generate_ticket("r1", "decode-t", "someone-else", PROMPT), "not this worker 'prefill-t'"),
                (generate_ticket("r1", "decode-t", "prefill-t", PROMPT, now=time.time() - 120), "expired"),
                (generate_ticket("r2", "decode-t", "prefill-t", PROMPT), "another request id"),
                (generate_ticket("r1", "decode-t", "prefill-t", PROMPT[:-1]), "another prompt"),
                (generate_ticket("r1", "decode-t", "prefill-t", PROMPT, cache_salt="t/other/"), "another cache salt"),
                (SIGNER.issue(tickets.DRAIN, "prefill-t"), "for operation 'drain'"),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Prefill(prefill_request(engine, ticket=ticket))
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert words in info.value.details()
            # A genuine ticket works once; a replay is refused.
            assert (
                await stub.Prefill(prefill_request(engine, ticket=(ticket := generate_ticket("r1", "decode-t", "prefill-t", PROMPT))))
            ).transfer_id
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Prefill(prefill_request(engine, ticket=ticket))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "single use" in info.value.details()

    asyncio.run(body())


def test_an_agent_not_registered_yet_is_unavailable_so_the_control_plane_tries_another():
    """Without the cluster's key (starting, or its replica just died) an agent cannot verify any
    ticket: UNAVAILABLE, a worker failure the control plane routes around, not PERMISSION_DENIED,
    which ends the request (a relayed request failed so while a replica of two was restarted)."""

    async def body() -> grpc.aio.AioRpcError:
        async with serve_agent("prefill-t", Role.PREFILL, verifier=tickets.TicketVerifier(b"")) as prefill:
            engine = prefill.engine
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await prefill.stub.Prefill(prefill_request(engine, ticket=generate_ticket("r1", "decode-t", "prefill-t", PROMPT)))
            return info.value

    error = asyncio.run(body())
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "has not registered yet" in error.details()
    assert classify(error.code().name) is Failure.WORKER
