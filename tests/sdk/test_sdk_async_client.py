"""kvplane.AsyncClient against the same server; each test drives its own event loop."""

from __future__ import annotations

import asyncio

import grpc
import pytest

import kvplane
from kvplane import AsyncClient
from kvplane.client import WorkerState
from tests.sdk.scripted_server import ScriptedServer


def test_generate_and_stream(server: ScriptedServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.endpoint) as client:
            result = await client.generate("hello", max_tokens=3)
            assert (result.text, result.token_ids, result.finish_reason) == ("hel", (104, 101, 108), "length")
            assert result.metrics.decode_worker == "decode-0" and result.request_id == "req-1"
            chunks = [c async for c in client.stream("abc")]
            assert [c.text for c in chunks] == ["ab", "c", ""]
            assert chunks[-1].finished and chunks[-1].metrics is not None

    asyncio.run(scenario())


def test_errors(server: ScriptedServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.endpoint) as client:
            with pytest.raises(kvplane.RejectedError) as info:
                await client.generate("reject")
            assert (info.value.retry_after_s, info.value.reason) == (1.5, "ttft_slo")
            with pytest.raises(kvplane.RejectedError):
                async for _ in client.stream("reject"):
                    pass
            with pytest.raises(kvplane.InvalidArgumentError, match="max_tokens must be > 0"):
                await client.route("invalid")
            with pytest.raises(kvplane.NotFoundError):
                await client.drain("nope")
            with pytest.raises(kvplane.KvplaneError, match="ended before the request finished"):
                await client.generate("truncated")
            with pytest.raises(ValueError, match="disagg must be one of"):
                client.stream("x", disagg="")

    asyncio.run(scenario())


def test_deadline(server: ScriptedServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.endpoint, timeout=0.3) as client:
            with pytest.raises(kvplane.UnavailableError) as info:
                await client.generate("slow")
            assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED

    asyncio.run(scenario())


def test_admin_calls(server: ScriptedServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.endpoint) as client:
            workers = await client.workers()
            assert [w.worker_id for w in workers] == ["prefill-0", "decode-0"]
            assert [c.blocks_by_tier for c in await client.cache()] == [{"device": 7, "host": 3}]
            assert (await client.drain("prefill-0")).state == WorkerState.DRAINING
            decision = await client.route("p")
            assert decision.decode_worker == "decode-0"

    asyncio.run(scenario())


def test_early_exit_cancels(server: ScriptedServer) -> None:
    async def scenario() -> bool:
        async with AsyncClient(server.endpoint) as client:
            stream = client.stream("long")
            async for chunk in stream:
                assert chunk.text == "x"
                break
            await stream.aclose()
            # Waited for here, with the client and its loop still running: the cancel must come
            # from aclose itself, not from the channel's teardown (which races the loop's end).
            return await asyncio.to_thread(server.servicer.cancelled.wait, 5)

    assert asyncio.run(scenario())


def test_env_endpoint_and_close_without_use(monkeypatch: pytest.MonkeyPatch, server: ScriptedServer) -> None:
    monkeypatch.setenv("KVPLANE_ENDPOINT", server.endpoint)

    async def scenario() -> None:
        client = AsyncClient()
        assert client.endpoint == server.endpoint
        assert len(await client.workers()) == 2
        await client.close()
        await AsyncClient().close()  # never opened: nothing to close, no error

    asyncio.run(scenario())


def test_a_replica_lost_after_the_final_message_is_no_reason_to_resume(server: ScriptedServer) -> None:
    async def scenario():
        async with AsyncClient(server.endpoint) as client:
            return await client.generate("lost-after-the-end")

    before = len(server.servicer.requests)
    result = asyncio.run(scenario())
    assert result.token_ids == (1, 2, 3) and result.text == "abc"
    assert len(server.servicer.requests) == before + 1
