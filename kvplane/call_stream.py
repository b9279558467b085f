"""Calls of one kind made as messages on one long-lived stream, an answer per message in the order
sent: a unary call costs the server several times the CPU of a message on an open stream (TLS,
HTTP/2 stream setup, the interceptors, a task). Agents send their keep-alives and load reports
this way for as long as they live, the SDK its lookaside reports.

Any number of callers may have a message in flight: writes go out one at a time and a reader
hands each answer to the oldest message waiting. The stream is opened on first use and again
after it ended, failed or the caller moved to another server. A server without the streaming
method (UNIMPLEMENTED: an older release) gets unary calls from then on. A message unanswered
within the timeout ends the stream and fails as DEADLINE_EXCEEDED; the messages waiting on a
stream that ends after answering fail with its error (UNAVAILABLE when it just ended): what
callers judge as they judge a failed call. A message not yet sent when its stream ended, or sent
on one that ended before its first answer, goes as a call: such a message may reach the server
twice, so only messages the server takes twice without harm go this way.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

log = logging.getLogger(__name__)


class _Open:
    """One open stream: the call, the messages waiting for their answers, the task reading them."""

    __slots__ = ("call", "server", "waiting", "writing", "reader", "settled", "answered", "error")

    def __init__(self, call: grpc.aio.StreamStreamCall, server: int) -> None:
        self.call = call
        self.server = server
        self.waiting: collections.deque[asyncio.Future] = collections.deque()
        self.writing = asyncio.Lock()  # grpc.aio takes one write at a time; write order is answer order
        self.reader: asyncio.Task | None = None
        # Set at the first answer or the end. Until then the stream carries only its first
        # message: a server without the method ends it UNIMPLEMENTED, and a second write beside
        # that would fail as INTERNAL, hiding why.
        self.settled = asyncio.Event()
        self.answered = False
        self.error: grpc.aio.AioRpcError | None = None  # why it ended

    def end(self, error: grpc.aio.AioRpcError) -> None:
        if self.error is None:
            self.error = error
        self.settled.set()
        while self.waiting:
            answer = self.waiting.popleft()
            if not answer.done():
                answer.set_exception(self.error)
                answer.exception()  # retrieved: a caller that gave up waiting logs nothing
        self.call.cancel()


class CallStream:
    def __init__(
        self,
        name: str,
        open_stream: Callable[[], grpc.aio.StreamStreamCall],
        unary: Callable[[Any, float], Awaitable[Any]],
        timeout_s: Callable[[], float],
    ) -> None:
        self._name = name  # for errors and the log: "load report", "keep-alive"
        self._open_stream = open_stream  # on the server the caller talks to now
        self._unary = unary
        self._timeout_s = timeout_s  # how long an answer may take (asked at each call: a lease's TTL comes later)
        self._open: _Open | None = None
        self.unary_only = False  # the server has no streaming method

    async def call(self, request: Any, server: int = 0) -> Any:
        """`request`'s answer from `server` (an index: a different one opens a new stream)."""
        timeout_s = self._timeout_s()
        if self.unary_only:
            return await self._unary(request, timeout_s)
        stream, first = self._stream(server)
        answer = asyncio.get_running_loop().create_future()
        queued = written = False
        try:
            async with asyncio.timeout(timeout_s):
                if not first:
                    await stream.settled.wait()
                if stream.error is None:
                    async with stream.writing:
                        stream.waiting.append(answer)
                        queued = True
                        try:
                            await stream.call.write(request)
                            written = True
                        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                            self._end(stream)  # it ended meanwhile; nothing more goes out on it
                if written:
                    return await answer
        except asyncio.CancelledError:
            if queued and not written:  # whether it went out is unknown, and with it which answer is whose
                self._end(stream)
            raise
        except TimeoutError:
            self._end(stream)
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer to a {self._name} in time") from None
        except grpc.aio.AioRpcError as e:  # the stream ended with the message on it, unanswered
            self._end(stream, e)
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                if not self.unary_only:
                    log.info("the server has no %s stream; making a call for each", self._name)
                self.unary_only = True
            elif stream.answered:
                raise
        # Not sent on the stream, or sent on one that ended before it answered anything (the
        # server may have no such method: a write beside its UNIMPLEMENTED fails as INTERNAL and
        # hides it): as a call. Such a message may reach the server twice; every message sent
        # this way is one it takes twice without harm (a report or keep-alive, by its sequence).
        return await self._unary(request, timeout_s)

    def end(self) -> None:
        """Ends the open stream; messages waiting on it fail as UNAVAILABLE."""
        if self._open is not None:
            self._end(self._open)

    def _stream(self, server: int) -> tuple[_Open, bool]:
        """The stream to `server`, and whether it was opened for this message."""
        stream = self._open
        if stream is not None and stream.server == server and not stream.call.done():
            return stream, False
        self.end()
        stream = self._open = _Open(self._open_stream(), server)
        stream.reader = asyncio.ensure_future(self._read(stream))
        return stream, True

    async def _read(self, stream: _Open) -> None:
        try:
            while True:
                reply = await stream.call.read()
                if reply is grpc.aio.EOF:
                    raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"the {self._name} stream ended")
                stream.answered = True
                stream.settled.set()
                if stream.waiting:  # an answer to nothing (a misbehaving server) is dropped
                    answer = stream.waiting.popleft()
                    if not answer.done():
                        answer.set_result(reply)
        except asyncio.CancelledError:
            self._end(stream)
        except grpc.aio.AioRpcError as e:
            self._end(stream, e)
        except Exception as e:  # e.g. an answer that does not parse
            self._end(stream, rpc_error(grpc.StatusCode.UNAVAILABLE, f"the {self._name} stream failed: {e}"))

    def _end(self, stream: _Open, error: grpc.aio.AioRpcError | None = None) -> None:
        """Ends `stream`; its waiting messages fail with `error` (the stream's own), else UNAVAILABLE."""
        if self._open is stream:
            self._open = None
        stream.end(error or rpc_error(grpc.StatusCode.UNAVAILABLE, f"the {self._name} stream ended"))
        if stream.reader is not None and stream.reader is not asyncio.current_task():
            stream.reader.cancel()


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """A failure of a stream in the shape of a failed call."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
