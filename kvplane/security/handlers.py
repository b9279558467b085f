"""Wrapping a gRPC method handler: checks that run before the servicer, and malformed requests.

`wrap(handler, before)` returns the same handler with `await before(context)` run before the
servicer's code (authentication, authorization, rate limits). `RequestGuard` makes a request that
does not parse as its message type an INVALID_ARGUMENT answer, instead of the UNKNOWN/INTERNAL
status gRPC gives a failing deserializer; every kvplane server installs it first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError

Before = Callable[[grpc.aio.ServicerContext], Awaitable[None]]


class _Malformed:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _safe(deserializer):
    if deserializer is None:
        return None

    def parse(data: bytes):
        try:
            return deserializer(data)
        except (DecodeError, ValueError, RuntimeError) as e:
            return _Malformed(type(e).__name__)

    return parse


async def _no_check(context: grpc.aio.ServicerContext) -> None:
    return None


def wrap(handler: grpc.RpcMethodHandler, before: Before = _no_check, *, guard_parsing: bool = False) -> grpc.RpcMethodHandler:
    """The same handler with `before(context)` awaited first (and, with guard_parsing, malformed
    requests answered INVALID_ARGUMENT)."""
    deserializer = _safe(handler.request_deserializer) if guard_parsing else handler.request_deserializer
    kwargs = {"request_deserializer": deserializer, "response_serializer": handler.response_serializer}

    async def check(request, context) -> None:
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid message of this method ({request.reason})")
        await before(context)

    if handler.unary_unary:
        inner = handler.unary_unary

        async def unary_unary(request, context):
            await check(request, context)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)
    if handler.unary_stream:
        inner_stream = handler.unary_stream

        async def unary_stream(request, context):
            await check(request, context)
            async for response in inner_stream(request, context):
                yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, **kwargs)
    # Client-streaming methods: the check runs once, at the start; with guard_parsing a malformed
    # message ends the call with INVALID_ARGUMENT when the servicer reaches it.
    if not guard_parsing:
        kwargs["request_deserializer"] = handler.request_deserializer

    async def checked(request_iterator, context):
        async for request in request_iterator:
            if isinstance(request, _Malformed):
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid message of this method ({request.reason})"
                )
            yield request

    if handler.stream_unary:
        inner_su = handler.stream_unary

        async def stream_unary(request_iterator, context):
            await before(context)
            return await inner_su(checked(request_iterator, context), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
    inner_ss = handler.stream_stream

    async def stream_stream(request_iterator, context):
        await before(context)
        async for response in inner_ss(checked(request_iterator, context), context):
            yield response

    return grpc.stream_stream_rpc_method_handler(stream_stream, **kwargs)


class RequestGuard(grpc.aio.ServerInterceptor):
    """Answers a request that does not parse with INVALID_ARGUMENT."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        return None if handler is None else wrap(handler, guard_parsing=True)
