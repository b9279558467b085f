"""The relay merges the agent's messages that queue up while the caller is slow; nothing is lost,
reordered or merged past the end, and a failure comes after everything received before it."""

from __future__ import annotations

import asyncio

import pytest

from kvplane.controlplane.relay import coalesced
from kvplane.v1 import agent_pb2


def _msg(tokens: list[int], finished: bool = False) -> agent_pb2.AgentGenerateResponse:
    reply = agent_pb2.AgentGenerateResponse(token_ids=tokens, text="".join(f"<{t}>" for t in tokens), finished=finished)
    if finished:
        reply.finish_reason = "length"
        reply.metrics.prompt_tokens = 7
    return reply


async def _agent(messages, fail: Exception | None = None, closed: list | None = None):
    try:
        for m in messages:
            yield m
            await asyncio.sleep(0)  # one message per loop turn, like a fast engine
        if fail is not None:
            raise fail
    finally:
        if closed is not None:
            closed.append(True)


def _run(consumer):
    return asyncio.run(consumer())


def test_a_fast_reader_gets_every_message_as_sent():
    messages = [_msg([i]) for i in range(5)] + [_msg([], finished=True)]

    async def read():
        return [list(m.token_ids) async for m in coalesced(_agent(messages))]

    assert _run(read) == [[0], [1], [2], [3], [4], []]


def test_a_slow_reader_gets_what_queued_up_in_one_message_and_the_end_with_its_metrics():
    messages = [_msg([i]) for i in range(10)] + [_msg([], finished=True)]

    async def read():
        out = []
        async for m in coalesced(_agent(messages)):
            out.append(m)
            await asyncio.sleep(0.05)  # the caller's writes are slow: everything else arrives meanwhile
        return out

    out = _run(read)
    assert [t for m in out for t in m.token_ids] == list(range(10))
    assert "".join(m.text for m in out) == "".join(f"<{i}>" for i in range(10))
    assert len(out) == 2 and out[-1].finished and out[-1].finish_reason == "length" and out[-1].metrics.prompt_tokens == 7


def test_a_failure_comes_after_every_token_received_before_it():
    messages = [_msg([i]) for i in range(4)]

    async def read():
        got = []
        with pytest.raises(RuntimeError, match="worker died"):
            async for m in coalesced(_agent(messages, fail=RuntimeError("worker died"))):
                got.extend(m.token_ids)
                await asyncio.sleep(0.05)
        return got

    assert _run(read) == [0, 1, 2, 3]


def test_leaving_early_closes_the_agents_stream():
    closed: list = []

    async def read():
        stream = coalesced(_agent([_msg([i]) for i in range(100)], closed=closed))
        async for _ in stream:
            break
        await stream.aclose()
        return closed

    assert _run(read) == [True]


def test_a_remote_prefills_end_survives_being_merged_with_the_tokens_after_it():
    # (After a first message the reader takes at once: the news queues up with the tokens behind it.)
    news = agent_pb2.AgentGenerateResponse(remote_prefill_done=True)
    messages = [_msg([0]), news] + [_msg([i]) for i in range(1, 4)] + [_msg([], finished=True)]

    async def read():
        out = []
        async for m in coalesced(_agent(messages)):
            out.append(m)
            await asyncio.sleep(0.05)
        return out

    out = _run(read)
    assert [t for m in out for t in m.token_ids] == list(range(4))
    assert len(out) == 2 and not out[0].remote_prefill_done and out[1].remote_prefill_done
