"""The agent checks an engine's optional capabilities and its health before using them.

The engine is the real reference engine with its KV import/export and profiling capabilities
withheld (what an engine that moves KV its own way, or measures no steps, reports): the RPCs that
need them are refused with FAILED_PRECONDITION naming the engine, and everything else still works.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from kvplane import tickets
from kvplane.convert import layout_to_pb
from kvplane.dataplane.engines.reference import Engine, EngineConfig, ReferenceAdapter
from kvplane.types import Role
from kvplane.v1 import agent_pb2, common_pb2

from .helpers import generate_ticket, op_ticket, serve_agent, ticketed

PROMPT = list(range(1, 16 * 2 + 3))


class WithoutCapabilities(ReferenceAdapter):
    @property
    def kv_transfer(self):
        return None

    @property
    def profiling(self):
        return None


def generate_request(request_id: str, **fields) -> agent_pb2.AgentGenerateRequest:
    request = agent_pb2.AgentGenerateRequest(
        request_id=request_id, prompt_token_ids=PROMPT, sampling=common_pb2.SamplingParams(max_tokens=4), **fields
    )
    return ticketed(request, "w")


async def refused(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def test_an_engine_without_kv_transfer_or_profiling_serves_generate_and_refuses_the_rest():
    async def body():
        engine = WithoutCapabilities(Engine(EngineConfig(num_blocks=64)))
        async with serve_agent("w", Role.BOTH, engine=engine) as agent:
            assert list(agent.service.worker_info().transports) == []
            replies = [r async for r in agent.stub.Generate(generate_request("r1"))]
            assert replies[-1].finished and sum(len(r.token_ids) for r in replies) == 4

            prefill = agent_pb2.PrefillRequest(
                ticket=generate_ticket("r2", "d", "w", PROMPT), request_id="r2", prompt_token_ids=PROMPT,
                layout=layout_to_pb(engine.info.layout), transports=["grpc"],
            )  # fmt: skip
            error = await refused(agent.stub.Prefill(prefill))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "runs the reference engine, which does not move KV through kvplane transports" in error.details()
            assert "cannot export KV to a peer" in error.details()

            source = agent_pb2.PrefillSource(worker_id="p", endpoint="127.0.0.1:9", cached_only=True)
            error = await refused(_drain(agent.stub.Generate(generate_request("r3", prefill_from=source))))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "cannot import KV from a peer" in error.details()

            error = await refused(agent.stub.Profile(agent_pb2.ProfileRequest(ticket=op_ticket(tickets.PROFILE, "w"))))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "does not measure its steps" in error.details()
            assert agent.service.latency_model() is None
            assert engine.load().num_used_blocks == 0  # nothing was left pinned

    asyncio.run(body())


def test_requests_to_an_engine_that_is_not_serving_are_unavailable():
    async def body():
        async with serve_agent("w", Role.BOTH) as agent:
            await agent.engine.stop()
            error = await refused(_drain(agent.stub.Generate(generate_request("r1"))))
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert error.details() == "worker w's engine is not serving: the engine is stopped"

    asyncio.run(body())


async def _drain(call) -> None:
    async for _ in call:
        pass
