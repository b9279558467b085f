"""Calls of one kind made as messages on one long-lived stream to the replica the link talks to,
an answer per message: a unary call costs the control plane several times the CPU of a message
on an open stream (TLS, HTTP/2 stream setup, the interceptors, a task), and an agent makes one
per keep-alive and per load report for as long as it lives.

The stream is opened on first use and again after it ended, failed or the link moved to another
replica. A control plane without the streaming method (UNIMPLEMENTED: an older release) gets
unary calls from then on. A message unanswered within the timeout ends the stream and fails as
DEADLINE_EXCEEDED, a stream that ends fails as UNAVAILABLE: what the link's failover judges.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

log = logging.getLogger(__name__)


class CallStream:
    def __init__(
        self,
        name: str,
        open_stream: Callable[[], grpc.aio.StreamStreamCall],
        unary: Callable[[Any, float], Awaitable[Any]],
        timeout_s: Callable[[], float],
    ) -> None:
        self._name = name  # for the log: "load report", "keep-alive"
        self._open_stream = open_stream  # on the replica the link talks to now
        self._unary = unary
        self._timeout_s = timeout_s  # how long an answer may take (asked at each call: a lease's TTL comes later)
        self._call: grpc.aio.StreamStreamCall | None = None
        self._on = -1  # the replica `_call` is open to
        self.unary_only = False  # the control plane has no streaming method

    async def call(self, request: Any, replica: int) -> Any:
        """`request`'s answer from `replica` (the index of the one the link talks to now)."""
        timeout_s = self._timeout_s()
        if self.unary_only:
            return await self._unary(request, timeout_s)
        if self._call is None or self._on != replica or self._call.done():
            self.end()
            self._call, self._on = self._open_stream(), replica
        call = self._call
        try:
            async with asyncio.timeout(timeout_s):
                await call.write(request)
                reply = await call.read()
        except TimeoutError:
            self.end()
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer to a {self._name} in time") from None
        except grpc.aio.AioRpcError as e:
            self.end()
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("the control plane has no %s stream; making a call for each", self._name)
                self.unary_only = True
                return await self.call(request, replica)
            raise
        except asyncio.InvalidStateError:  # written to a stream that had just ended
            self.end()
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"the {self._name} stream ended") from None
        if reply is grpc.aio.EOF:
            self.end()
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"the {self._name} stream ended")
        return reply

    def end(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """A failure of a stream as the link's failover judges calls."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
