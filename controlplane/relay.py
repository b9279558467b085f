"""Relaying one attempt of a request from its decode agent, with progress timeouts.

`agent_stream` calls Agent.Generate with the caller's remaining deadline and yields the agent's
messages; it raises `WorkerFailed` when the agent's call fails or makes no progress: no message
carrying a token within `first_token_timeout_s` of the call (queue, prefill and KV transfer
included) or within `token_timeout_s` of the previous token. Either way the agent's call is
cancelled on the way out, so the agent aborts the request and frees its blocks. What to do next
(retry, migrate, fail) is controlplane/core/failover.py's to decide.

`coalesced` reads the agent's stream as fast as it comes and merges what queued up while the
previous message was being written into one message (tokens and text joined, in order) instead of
relaying one message per token. Messages queue up when the caller reads slower than the engine
generates (gRPC's flow-control window is full, so the write waits) or when this replica is busy
(its event loop runs other streams): then it sends fewer, larger messages, and the agent is never
held back by the caller.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc

from kvplane.controlplane.core.failover import Failure, classify
from kvplane.v1 import agent_pb2, agent_pb2_grpc


class WorkerFailed(Exception):
    """One attempt failed on its decode worker; `code` is what the caller would be told."""

    def __init__(self, worker_id: str, failure: Failure, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"decode worker {worker_id}: {details}")
        self.worker_id = worker_id
        self.failure = failure
        self.code = code
        self.details = details


async def agent_stream(
    stub: agent_pb2_grpc.AgentStub,
    request: agent_pb2.AgentGenerateRequest,
    worker_id: str,
    *,
    time_left_s: float | None,
    first_token_timeout_s: float,
    token_timeout_s: float,
    paused_since: Callable[[float], bool] = lambda moment: False,
) -> AsyncIterator[agent_pb2.AgentGenerateResponse]:
    """`paused_since(t)`: whether this process was itself paused after t (pause.py); a timeout that
    expired while we were not running is not the worker's stall, and the wait starts again.

    The progress timeouts are one timer per stream, moved on lazily: a message only records when
    it came, and the timer, when it fires, sleeps again until the latest message's deadline, never
    longer than the shorter timeout (the first token switches which one applies). A relayed token
    then costs one read, not a task, a wait and a timer of its own (a long relayed request 0.59x
    the control plane's CPU, docs/benchmarks.md)."""
    call = stub.Generate(request, timeout=time_left_s)
    loop = asyncio.get_running_loop()
    progress = _Progress(time.monotonic())
    longest_sleep = min(first_token_timeout_s, token_timeout_s)

    def check() -> None:
        timeout = token_timeout_s if progress.got_token else first_token_timeout_s
        now = time.monotonic()
        if now < progress.at + timeout:
            progress.timer = loop.call_later(min(progress.at + timeout - now, longest_sleep), check)
        elif paused_since(progress.at):
            progress.at = now  # we were frozen, not the worker: give it its time again
            progress.timer = loop.call_later(longest_sleep, check)
        else:
            what = "the next token" if progress.got_token else "the first token"
            progress.stalled = f"no progress: {what} did not come within {timeout:g} s"
            call.cancel()

    progress.timer = loop.call_later(longest_sleep, check)
    try:
        async for reply in call:
            if reply.token_ids or reply.finished:  # news without a token (a remote prefill's end) is not the first token
                progress.at = time.monotonic()
            if reply.token_ids:
                progress.got_token = True
            yield reply
    except grpc.aio.AioRpcError as e:
        raise WorkerFailed(worker_id, classify(e.code().name), e.code(), f"{e.code().name}: {e.details()}") from None
    except asyncio.CancelledError:
        if progress.stalled is None:
            raise  # our own caller went away
        raise WorkerFailed(worker_id, Failure.STALLED, grpc.StatusCode.UNAVAILABLE, progress.stalled) from None
    finally:
        progress.timer.cancel()
        call.cancel()  # a no-op after completion; otherwise the agent aborts the request


class _Progress:
    """When an agent stream last made progress, and its timer."""

    __slots__ = ("at", "got_token", "stalled", "timer")

    def __init__(self, at: float) -> None:
        self.at = at
        self.got_token = False
        self.stalled: str | None = None  # why the stream was cancelled as stalled
        self.timer: asyncio.TimerHandle | None = None


_END = object()


async def coalesced(replies: AsyncIterator[agent_pb2.AgentGenerateResponse]) -> AsyncIterator[agent_pb2.AgentGenerateResponse]:
    """`replies`, with the messages that queued up while the previous one was being written merged
    into one. A failure of `replies` is raised after every message received before it."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        try:
            async for reply in replies:
                queue.put_nowait(reply)
            queue.put_nowait(_END)
        except Exception as e:  # WorkerFailed and the like: raised to the reader in order
            queue.put_nowait(e)
        finally:
            await replies.aclose()

    task = asyncio.ensure_future(pump())
    try:
        while True:
            item = await queue.get()
            while isinstance(item, agent_pb2.AgentGenerateResponse) and not item.finished and not queue.empty():
                following = queue.get_nowait()
                if not isinstance(following, agent_pb2.AgentGenerateResponse):
                    yield item
                    item = following
                    break
                merged = agent_pb2.AgentGenerateResponse()
                merged.CopyFrom(following)
                merged.token_ids[:0] = item.token_ids
                merged.text = item.text + following.text
                merged.remote_prefill_done = item.remote_prefill_done or following.remote_prefill_done
                item = merged
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
