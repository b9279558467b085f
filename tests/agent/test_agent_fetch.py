"""Fetch instead of recompute: a worker pulls another's cached prefix (the holder pins it without
computing) and prefills only the rest; the tokens equal a local computation. Two real Agent
services with real engines over loopback gRPC; the test plays the control plane."""

from __future__ import annotations

import asyncio

from kvplane.dataplane.engines import EngineAdapter, EngineRequest, SamplingParams
from kvplane.types import Role
from kvplane.v1 import agent_pb2, common_pb2

from .helpers import serve_agent, ticketed

PREFIX = [(7 * i + 3) % 250 for i in range(16 * 6)]  # six full blocks, cached on the holder
PROMPT = PREFIX + list(range(40, 61))  # plus a 21-token suffix nobody holds


async def _run_on_engine(engine: EngineAdapter, prompt: list[int]) -> None:
    async for _ in await engine.generate(EngineRequest("warm", prompt, SamplingParams(max_tokens=2))):
        pass


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
        async with (
            serve_agent("holder", Role.DECODE) as holder,
            serve_agent("puller", Role.BOTH) as puller_agent,
            serve_agent("local", Role.BOTH) as local_agent,
        ):
            holder_engine, holder_endpoint = holder.engine, holder.endpoint
            puller, local = puller_agent.stub, local_agent.stub
            await _run_on_engine(holder_engine, PREFIX)
            holder_engine.take_kv_events()
            sampling = common_pb2.SamplingParams(max_tokens=12)
            fetched_tokens, m = await _generate(
                puller,
                ticketed(
                    agent_pb2.AgentGenerateRequest(
                        request_id="r1",
                        prompt_token_ids=PROMPT,
                        sampling=sampling,
                        prefill_from=agent_pb2.PrefillSource(worker_id="holder", endpoint=holder_endpoint, cached_only=True),
                    ),
                    "puller",
                ),
            )
            local_tokens, local_m = await _generate(
                local,
                ticketed(agent_pb2.AgentGenerateRequest(request_id="r2", prompt_token_ids=PROMPT, sampling=sampling), "local"),
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
