"""A server interceptor that answers undecodable request bytes with INVALID_ARGUMENT.

grpc-python turns an exception in a request deserializer into UNKNOWN ("Unexpected DecodeError"),
which tells the caller nothing it can act on. Here the deserializer of every unary-request RPC
(all of kvplane's) is wrapped: bytes that do not parse as the method's request message become a
`Malformed` marker, and the wrapped handler answers it with INVALID_ARGUMENT naming the message
type, before any servicer code runs. The server keeps serving.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc


@dataclass(frozen=True, slots=True)
class Malformed:
    """Request bytes that did not decode; `error` is the parser's message."""

    error: str


def _decoder(deserializer):
    def decode(data: bytes):
        try:
            return deserializer(data)
        except Exception as e:  # noqa: BLE001 - any parse failure is the caller's malformed input
            return Malformed(f"{type(e).__name__}: {e}")

    return decode


def _message(method: str, bad: Malformed) -> str:
    return f"the request to {method} is not a valid protobuf message ({bad.error}); send a well-formed request"


def _unary(behavior, method: str):
    async def handle(request, context):
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _message(method, request))
        return await behavior(request, context)

    return handle


def _stream(behavior, method: str):
    async def handle(request, context):
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _message(method, request))
        async for response in behavior(request, context):
            yield response

    return handle


class BadRequestInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None or handler.request_streaming:
            return handler
        method = handler_call_details.method
        decode = _decoder(handler.request_deserializer)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary(handler.unary_unary, method), request_deserializer=decode, response_serializer=handler.response_serializer
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _stream(handler.unary_stream, method), request_deserializer=decode, response_serializer=handler.response_serializer
            )
        return handler
