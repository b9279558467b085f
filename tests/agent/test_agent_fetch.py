"""Fetch instead of recompute: a worker pulls another's cached prefix (the holder pins it without
computing) and prefills only the rest; the tokens equal a local computation. Two real Agent
services with real engines over loopback gRPC; the test plays the control plane."""
from __future__ import annotations

import asyncio
import contextlib

from dataplane.agent.config import AgentConfig
from dataplane.agent.service import AgentService
from dataplane.engine import Engine, EngineConfig, EngineRequest, SamplingParams
from dataplane.transport import make_transport
from kvplane import tickets
from kvplane.grpc_util import aio_channel, make_server
from kvplane.types import Role
from kvplane.v1 import agent_pb2, agent_pb2_grpc, common_pb2

KEY = b"test-ticket-key"
PREFIX = [(7 * i + 3) % 250 for i in range(16 * 6)]  # six full blocks, cached on the holder
PROMPT = PREFIX + list(range(40, 61))  # plus a 21-token suffix nobody holds


@contextlib.asynccontextmanager
async def agent(worker_id: str, role: Role):
    engine = Engine(EngineConfig(num_blocks=64))
    engine.start()
    config = AgentConfig(worker_id=worker_id, role=role).validate()
    server = make_server()
    port = server.add_insecure_port("127.0.0.1:0")
    transports = {"grpc": make_transport("grpc", engine.pool, agent_name=worker_id)}
    endpoint = f"127.0.0.1:{port}"
    service = AgentService(config, engine, transports, lambda: KEY, endpoint)
    agent_pb2_grpc.add_AgentServicer_to_server(service, server)
    await server.start()
    service.start()
    channel = aio_channel(endpoint)
    try:
        yield engine, agent_pb2_grpc.AgentStub(channel), endpoint
    finally:
        await channel.close()
        await server.stop(0)
        await service.close()
        engine.stop()


def _run_on_engine(engine: Engine, prompt: list[int]) -> list[int]:
    done, tokens = asyncio.Event(), []
    loop = asyncio.get_running_loop()

    def sink(out):
        tokens.extend(out.new_token_ids)
        if out.finished:
            loop.call_soon_threadsafe(done.set)

    engine.submit(EngineRequest("warm", prompt, SamplingParams(max_tokens=2)), sink)
    return done


async def _generate(stub, request) -> tuple[list[int], common_pb2.RequestMetrics]:
    tokens, metrics = [], None
    async for reply in stub.Generate(request):
        tokens.extend(reply.token_ids)
        if reply.finished:
            metrics = reply.metrics
    return tokens, metrics


def test_pulled_prefix_gives_the_same_tokens_as_a_local_computation():
    async def main():
        # The holder is a decode worker: fetching needs no prefill role, since nothing is computed.
        async with agent("holder", Role.DECODE) as (holder_engine, _, holder_endpoint), agent("puller", Role.BOTH) as (
            puller_engine,
            puller,
            _,
        ), agent("local", Role.BOTH) as (_, local, _):
            await _run_on_engine(holder_engine, PREFIX).wait()
            holder_engine.take_kv_events()
            sampling = common_pb2.SamplingParams(max_tokens=12)
            fetched_tokens, m = await _generate(
                puller,
                agent_pb2.AgentGenerateRequest(
                    ticket=tickets.issue(KEY, "r1", "puller", "holder"),
                    request_id="r1",
                    prompt_token_ids=PROMPT,
                    sampling=sampling,
                    prefill_from=agent_pb2.PrefillSource(worker_id="holder", endpoint=holder_endpoint, cached_only=True),
                ),
            )
            local_tokens, local_m = await _generate(
                local,
                agent_pb2.AgentGenerateRequest(
                    ticket=tickets.issue(KEY, "r2", "local", ""), request_id="r2", prompt_token_ids=PROMPT, sampling=sampling
                ),
            )
            assert holder_engine.take_kv_events() == []  # the holder computed (and stored) nothing
            assert holder_engine.load().num_used_blocks == 0  # and its pins were released
            return fetched_tokens, m, local_tokens, local_m

    fetched_tokens, m, local_tokens, local_m = asyncio.run(main())
    assert (m.kv_fetched_from, m.kv_fetched_tokens, m.kv_transfer_blocks) == ("holder", 6 * 16, 6)
    assert m.disaggregated is False and m.prefill_worker == m.decode_worker == "puller"
    assert (m.cached_tokens, m.prefill_computed_tokens) == (6 * 16, 21)
    assert local_m.cached_tokens == 0
    assert len(fetched_tokens) == 12 and fetched_tokens == local_tokens
