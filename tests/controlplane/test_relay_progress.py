"""The relay's progress timeouts against a real gRPC agent server in this process: a stream that
stops after its first tokens is judged by the token timeout, one that never starts by the
first-token timeout, and either way the agent's call is cancelled."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from kvplane.controlplane.core.failover import Failure
from kvplane.controlplane.relay import WorkerFailed, agent_stream
from kvplane.v1 import agent_pb2, agent_pb2_grpc


class _StallingAgent(agent_pb2_grpc.AgentServicer):
    """Sends `num_tokens` tokens, then nothing until the call is cancelled."""

    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens
        self.cancelled = asyncio.Event()

    async def Generate(self, request, context):
        for i in range(self.num_tokens):
            yield agent_pb2.AgentGenerateResponse(token_ids=[i], text=f"<{i}>")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def _relay(
    num_tokens: int, first_token_timeout_s: float, token_timeout_s: float, agent: agent_pb2_grpc.AgentServicer | None = None
) -> tuple[list[int], WorkerFailed, bool]:
    agent = agent or _StallingAgent(num_tokens)
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            tokens: list[int] = []

            async def read() -> None:
                async for reply in agent_stream(
                    stub, agent_pb2.AgentGenerateRequest(), "w1", time_left_s=None,
                    first_token_timeout_s=first_token_timeout_s, token_timeout_s=token_timeout_s,
                ):  # fmt: skip
                    tokens.extend(reply.token_ids)

            with pytest.raises(WorkerFailed) as info:
                await asyncio.wait_for(read(), timeout=20)  # a hang fails the test instead of the suite
            await asyncio.wait_for(agent.cancelled.wait(), timeout=10)
            return tokens, info.value, agent.cancelled.is_set()
    finally:
        await server.stop(None)


def test_a_stream_that_stops_after_its_first_tokens_is_judged_by_the_token_timeout():
    # The first-token timeout (30 s) is far longer: judged by it, the read would time out at 20 s.
    # (1 s: a loaded machine may starve this process a moment between the three tokens.)
    tokens, failure, cancelled = asyncio.run(_relay(3, first_token_timeout_s=30.0, token_timeout_s=1.0))
    assert tokens == [0, 1, 2]
    assert failure.failure is Failure.STALLED and failure.code == grpc.StatusCode.UNAVAILABLE
    assert "the next token did not come within 1 s" in failure.details and cancelled


def test_a_stream_with_no_token_is_judged_by_the_first_token_timeout():
    tokens, failure, cancelled = asyncio.run(_relay(0, first_token_timeout_s=0.3, token_timeout_s=30.0))
    assert tokens == [] and failure.failure is Failure.STALLED
    assert "the first token did not come within 0.3 s" in failure.details and cancelled


class _SteadyAgent(agent_pb2_grpc.AgentServicer):
    async def Generate(self, request, context):
        for i in range(5):
            yield agent_pb2.AgentGenerateResponse(token_ids=[i], text=f"<{i}>", finished=i == 4)
            await asyncio.sleep(0.1)


def test_a_relay_whose_own_loop_was_frozen_does_not_blame_the_worker():
    """The replica itself does not run for longer than the token timeout (SIGSTOP, a long GC: here
    the loop is blocked). The relay's timer fires before the pause detector's tick has run (a turn
    of the loop later); the detector's overdue tick says the time was lost here."""
    import time

    from kvplane.controlplane.pause import PauseDetector

    async def body() -> list[int]:
        pauses = PauseDetector()
        pauses.start()
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentServicer_to_server(_SteadyAgent(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                tokens: list[int] = []
                async for reply in agent_stream(
                    agent_pb2_grpc.AgentStub(channel), agent_pb2.AgentGenerateRequest(), "w1", time_left_s=None,
                    first_token_timeout_s=5.0, token_timeout_s=0.5, paused_since=pauses.paused_since,
                ):  # fmt: skip
                    tokens.extend(reply.token_ids)
                    if len(tokens) == 1:
                        time.sleep(1.5)  # the whole loop stands still, three token timeouts
                return tokens
        finally:
            await pauses.stop()
            await server.stop(None)

    assert asyncio.run(asyncio.wait_for(body(), timeout=20)) == [0, 1, 2, 3, 4]


class _NewsOnlyAgent(agent_pb2_grpc.AgentServicer):
    """Says its remote prefill ended, again and again, and never sends a token."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.num_sent = 0

    async def Generate(self, request, context):
        try:
            while True:
                yield agent_pb2.AgentGenerateResponse(remote_prefill_done=True)
                self.num_sent += 1
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def test_news_without_a_token_does_not_hold_off_the_first_token_timeout():
    # Counted as progress, the news every 50 ms would keep the stream alive until _relay's 20 s bound.
    agent = _NewsOnlyAgent()
    tokens, failure, cancelled = asyncio.run(_relay(0, first_token_timeout_s=0.5, token_timeout_s=30.0, agent=agent))
    assert tokens == [] and agent.num_sent >= 2 and failure.failure is Failure.STALLED and cancelled
    assert "the first token did not come within 0.5 s" in failure.details
