"""Issue 28, item 6: ReleaseKV on a real agent over loopback gRPC. Expired tickets and over-long
transfer ids are refused before anything is remembered, and what is remembered for prefills not
pinned yet stays bounded however many genuine releases come."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from kvplane.dataplane.agent import service as agent_service
from kvplane.security.limits import MAX_ID_CHARS
from kvplane.types import Role
from kvplane.v1 import agent_pb2
from tests.agent.helpers import ManualClock, generate_ticket, serve_agent

PROMPT = list(range(1, 40))


def test_release_refuses_expired_tickets_and_long_ids_and_remembers_a_bounded_number(monkeypatch):
    clock = ManualClock()
    monkeypatch.setattr(agent_service, "MAX_EARLY_RELEASES", 16)

    async def body():
        async with serve_agent("prefill-r", Role.PREFILL, clock=clock) as agent:
            remembered = agent.service._released_early
            ticket = generate_ticket("r1", "decode-r", "prefill-r", PROMPT, now=clock.now)
            # The attack: ids of 4 MiB (under the 8 MiB message limit), each kept by the agent.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await agent.stub.ReleaseKV(agent_pb2.ReleaseKVRequest(transfer_id="x" * (4 << 20), ticket=ticket))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"longer than {MAX_ID_CHARS}" in info.value.details()
            # An expired ticket (its 30 s are over) releases nothing and is not remembered.
            clock.now += 120
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await agent.stub.ReleaseKV(agent_pb2.ReleaseKVRequest(transfer_id="t-old", ticket=ticket))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "expired" in info.value.details()
            assert remembered == {}
            # Genuine, valid releases of transfers not pinned are remembered, at most the cap.
            fresh = generate_ticket("r2", "decode-r", "prefill-r", PROMPT, now=clock.now)
            for i in range(40):
                reply = await agent.stub.ReleaseKV(agent_pb2.ReleaseKVRequest(transfer_id=f"t-{i}", ticket=fresh))
                assert reply.released is False
            assert len(remembered) == 16 and "t-39" in remembered and "t-0" not in remembered
            # The agent still serves a prefill afterwards.
            assert agent.engine.health() is None

    asyncio.run(body())
