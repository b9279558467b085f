"""The reference engine behind the engine interface (dataplane/engines/base.py): what it reports,
the generate stream and its refusals, abort, detokenize, health, and its capabilities."""

from __future__ import annotations

import asyncio

import pytest

from kvplane.dataplane import engines
from kvplane.dataplane.engines import EngineAdapter, EngineInputError, EngineRequest, SamplingParams
from kvplane.dataplane.engines.reference import EngineConfig, ReferenceAdapter

from .helpers import generate

CONFIG = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=256, max_tokens_limit=100)


def run_with_adapter(body, config: EngineConfig = CONFIG):
    async def main():
        adapter = engines.create("reference", config)
        await adapter.start()
        try:
            return await body(adapter)
        finally:
            await adapter.stop()

    return asyncio.run(main())


async def collect(adapter: EngineAdapter, request: EngineRequest) -> list:
    return [out async for out in await adapter.generate(request)]


def test_info_reports_the_model_layout_and_limits():
    async def body(adapter):
        info = adapter.info
        assert (info.model, info.max_context, info.vocab_size) == ("builtin-tiny", adapter.engine.max_context, 259)
        assert (info.max_tokens_limit, info.max_num_seqs, info.max_num_batched_tokens) == (100, 8, 256)
        assert info.layout == adapter.engine.layout and info.layout.block_size == 4
        assert adapter.load().num_total_blocks == 64

    run_with_adapter(body)


def test_generate_streams_the_engines_tokens_and_ends_with_one_finished_output(make_engine):
    prompt = [5, 6, 7, 8, 9, 10, 11]
    expected = generate(make_engine(), prompt, max_tokens=6).token_ids  # the engine driven directly

    async def body(adapter):
        outputs = await collect(adapter, EngineRequest("r1", prompt, SamplingParams(max_tokens=6)))
        assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
        assert outputs[-1].finish_reason == "length"
        return [t for o in outputs for t in o.new_token_ids]

    assert run_with_adapter(body) == expected


def test_generate_refuses_before_any_output():
    async def body(adapter):
        with pytest.raises(EngineInputError, match="max_tokens 101 exceeds this engine's limit of 100"):
            await adapter.generate(EngineRequest("r1", [1, 2, 3], SamplingParams(max_tokens=101)))
        assert adapter.load().num_waiting == 0

    run_with_adapter(body)


def test_abort_ends_the_stream_with_abort():
    async def body(adapter):
        stream = await adapter.generate(EngineRequest("r1", [1, 2, 3], SamplingParams(max_tokens=100, ignore_eos=True)))
        adapter.abort("r1")
        adapter.abort("unknown")  # ignored
        outputs = [out async for out in stream]
        assert outputs[-1].finished and outputs[-1].finish_reason == "abort"
        assert sum(len(o.new_token_ids) for o in outputs) < 100

    run_with_adapter(body)


def test_stop_aborts_requests_in_flight_and_health_says_why():
    async def main():
        adapter = engines.create("reference", CONFIG)
        assert adapter.health() == "the engine is not started"
        await adapter.start()
        assert adapter.health() is None
        stream = await adapter.generate(EngineRequest("r1", [1, 2, 3], SamplingParams(max_tokens=100, ignore_eos=True)))
        await adapter.stop()
        outputs = [out async for out in stream]
        assert outputs[-1].finish_reason == "abort"
        assert adapter.health() == "the engine is stopped"

    asyncio.run(main())


def test_detokenize_reads_the_byte_tokenizers_ids():
    async def body(adapter):
        ids = list("héllo".encode())  # what the control plane's byte tokenizer sends the builtin model
        assert await adapter.detokenize(ids) == "héllo"
        assert await adapter.detokenize(ids[:2]) == "h\ufffd"  # a cut character never raises

    run_with_adapter(body)


def test_it_offers_kv_import_export_and_profiling():
    async def body(adapter):
        assert adapter.kv_transfer.pool.num_blocks == 64
        await collect(adapter, EngineRequest("r1", list(range(1, 10)), SamplingParams(max_tokens=1)))
        assert adapter.profiling.take_step_timings()  # the prefill step was measured
        hashes, block_ids = adapter.kv_transfer.pin_cached_prefix(list(range(1, 10)))
        assert len(hashes) == len(block_ids) == 2  # two full blocks of 4 tokens cached
        assert adapter.kv_transfer.missing_blocks(hashes) == []
        adapter.kv_transfer.unpin(block_ids)
        assert adapter.load().num_used_blocks == 0

    run_with_adapter(body)


def test_the_adapter_is_what_the_registry_builds():
    async def body(adapter):
        assert isinstance(adapter, ReferenceAdapter)

    run_with_adapter(body)
