"""A decode worker whose KV pool is full when a remotely prefilled prompt is to be pulled in waits
for free blocks (as vLLM's and SGLang's decode workers queue for memory) instead of computing
the prompt again, up to import_wait_s; past that it prefills locally. Two real Agent services
with real engines over loopback gRPC; the test plays the control plane and fills the decode
pool by reserving its blocks as an import would."""

from __future__ import annotations

import asyncio
import time

from kvplane.types import Role
from kvplane.v1 import agent_pb2, common_pb2

from .helpers import serve_agent, ticketed, wait_until

PROMPT = [(5 * i + 1) % 250 for i in range(16 * 4 + 5)]  # four full blocks and a tail
NUM_BLOCKS = 64  # serve_agent's reference engine


async def _generate(stub, request) -> common_pb2.RequestMetrics:
    async for reply in stub.Generate(request):
        if reply.finished:
            return reply.metrics
    raise AssertionError("the stream ended without a finished reply")


def _remote(prefill_endpoint: str) -> agent_pb2.AgentGenerateRequest:
    return ticketed(
        agent_pb2.AgentGenerateRequest(
            request_id="r1",
            prompt_token_ids=PROMPT,
            sampling=common_pb2.SamplingParams(max_tokens=4),
            prefill_from=agent_pb2.PrefillSource(worker_id="prefill", endpoint=prefill_endpoint),
        ),
        "decode",
    )


def test_a_full_decode_pool_is_waited_on_and_the_prefilled_kv_pulled_in():
    async def main():
        async with serve_agent("prefill", Role.PREFILL) as prefill, serve_agent("decode", Role.DECODE) as decode:
            kv = decode.engine.kv_transfer
            filler = kv.allocate_for_import(NUM_BLOCKS)
            assert filler is not None and kv.allocate_for_import(1) is None  # the decode pool is full
            generating = asyncio.create_task(_generate(decode.stub, _remote(prefill.endpoint)))
            # The prompt is prefilled and pinned on the prefill worker: the decode side is waiting to pull.
            await wait_until(lambda: prefill.engine.load().num_used_blocks == 4, "the prefill worker pinned the prompt")
            await asyncio.sleep(0.2)
            assert not generating.done()
            kv.abort_import(filler)  # steps finishing elsewhere free the pool
            released_at = time.monotonic()
            metrics = await generating
            after_release_ms = (time.monotonic() - released_at) * 1000
            assert prefill.engine.load().num_used_blocks == 0  # the pins were released after the pull
            return metrics, after_release_ms

    m, after_release_ms = asyncio.run(main())
    assert m.disaggregated and m.prefill_worker == "prefill" and m.decode_worker == "decode"
    assert m.kv_transfer_blocks == 4 and m.prefill_computed_tokens == len(PROMPT)
    # The transfer's time is the pull's, which began after the release: the wait before it is
    # not the link's time (the control plane learns the link's rate from it).
    assert 0 < m.kv_transfer_ms <= after_release_ms


def test_past_import_wait_the_decode_worker_prefills_locally():
    async def main():
        async with (
            serve_agent("prefill", Role.PREFILL) as prefill,
            serve_agent("decode", Role.DECODE, import_wait_s=0.05) as decode,
        ):
            kv = decode.engine.kv_transfer
            filler = kv.allocate_for_import(NUM_BLOCKS)
            generating = asyncio.create_task(_generate(decode.stub, _remote(prefill.endpoint)))
            # Given up on the pull: the request waits in the decode engine's own queue for blocks.
            await wait_until(lambda: decode.engine.load().num_waiting == 1, "the request queued for a local prefill")
            await wait_until(lambda: prefill.engine.load().num_used_blocks == 0, "the prefill worker's pins released")
            kv.abort_import(filler)
            return await generating

    m = asyncio.run(main())
    assert not m.disaggregated and m.prefill_worker == m.decode_worker == "decode"
    assert m.kv_transfer_blocks == 0
