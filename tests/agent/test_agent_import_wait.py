"""A decode worker whose KV pool is full when a remotely prefilled prompt is to be pulled in waits
for free blocks (as vLLM's and SGLang's decode workers queue for memory) instead of computing
the prompt again, up to import_wait_s; past that it prefills locally. Two real Agent services
with real engines over loopback gRPC; the test plays the control plane and fills the decode
pool by reserving its blocks as an import would."""

from __future__ import annotations

import asyncio
import time

import grpc

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


def _told(request: agent_pb2.AgentGenerateRequest) -> agent_pb2.AgentGenerateRequest:
    request.report_prefill_done = True  # not a field the ticket binds
    return request


def test_the_caller_hears_the_remote_prefill_end_before_the_pull():
    """A relaying control plane stops counting the prompt in the prefill worker's queue when it
    is computed, not at the first token, which comes after the pull and any wait for blocks."""

    async def main():
        async with serve_agent("prefill", Role.PREFILL) as prefill, serve_agent("decode", Role.DECODE) as decode:
            kv = decode.engine.kv_transfer
            filler = kv.allocate_for_import(NUM_BLOCKS)  # the pull will wait for blocks
            stream = decode.stub.Generate(_told(_remote(prefill.endpoint)))
            first = await asyncio.wait_for(stream.read(), timeout=30)
            assert first.remote_prefill_done and not first.token_ids and not first.finished
            assert prefill.engine.load().num_used_blocks == 4  # computed and pinned, not pulled yet
            kv.abort_import(filler)
            rest = []
            while (reply := await stream.read()) is not grpc.aio.EOF:
                rest.append(reply)
            return rest

    rest = asyncio.run(main())
    assert not any(r.remote_prefill_done for r in rest)
    assert sum(len(r.token_ids) for r in rest) == 4 and rest[-1].finished and rest[-1].metrics.disaggregated


def test_unasked_no_news_comes_before_the_tokens():
    async def main():
        async with serve_agent("prefill", Role.PREFILL) as prefill, serve_agent("decode", Role.DECODE) as decode:
            return [reply async for reply in decode.stub.Generate(_remote(prefill.endpoint))]

    replies = asyncio.run(main())
    assert replies[0].token_ids and not any(r.remote_prefill_done for r in replies)


def test_a_caller_gone_after_the_news_leaves_nothing_pinned():
    async def main():
        async with serve_agent("prefill", Role.PREFILL) as prefill, serve_agent("decode", Role.DECODE) as decode:
            kv = decode.engine.kv_transfer
            filler = kv.allocate_for_import(NUM_BLOCKS)
            stream = decode.stub.Generate(_told(_remote(prefill.endpoint)))
            first = await asyncio.wait_for(stream.read(), timeout=30)
            assert first.remote_prefill_done
            stream.cancel()  # the caller goes away while the pull waits for blocks
            await wait_until(lambda: prefill.engine.load().num_used_blocks == 0, "the prefill worker's pins released")
            kv.abort_import(filler)
            await wait_until(lambda: decode.engine.load().num_used_blocks == 0, "the decode pool empty again")
            return decode.engine.load(), decode.service.num_pinned_blocks

    load, importing = asyncio.run(main())
    assert load.num_running == 0 and load.num_waiting == 0 and importing == 0
