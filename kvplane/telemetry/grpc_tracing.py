"""gRPC interceptors that carry trace context in metadata and open rpc.* spans (grpc.aio).

Server side: extract `traceparent` from the call's metadata, run the handler inside a SERVER span
named `<package.Service>/<Method>` (OpenTelemetry's RPC conventions), record the status code.
Client side: a CLIENT span per call whose context goes out as `traceparent`; the span ends when
the call completes (done callback), so streaming calls need no wrapping of their iterators.

What is traced: the request path, not housekeeping. A server call starts a trace only for
ROOT_METHODS (Generate and Route); any other call is traced when it arrives with a parent
context. Clients only continue a trace: a call made outside any span (the agents' lease,
load and KV-event loops) gets no span and no metadata. Installed by kvplane.grpc_util only
when tracing is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from kvplane.telemetry import tracing

_UNTRACED_PREFIXES = ("/grpc.health.", "/grpc.reflection.", "/kvplane.v1.Registry/")
ROOT_METHODS = frozenset({"/kvplane.v1.Kvplane/Generate", "/kvplane.v1.Kvplane/Route"})


def _names(method: str) -> tuple[str, str, str]:
    """'/kvplane.v1.Agent/Generate' -> ('kvplane.v1.Agent/Generate', 'kvplane.v1.Agent', 'Generate')."""
    full = method.lstrip("/")
    service, _, name = full.rpartition("/")
    return full, service, name


def _rpc_attributes(method: str) -> dict[str, str]:
    _, service, name = _names(method)
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


def _set_status(span, code: grpc.StatusCode | None) -> None:
    code = code or grpc.StatusCode.OK
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code is not grpc.StatusCode.OK:
        span.set_status(Status(StatusCode.ERROR, code.name))


# -- server ---------------------------------------------------------------------------------------


class ServerTracingInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_UNTRACED_PREFIXES):
            return handler
        metadata = {k: v for k, v in (handler_call_details.invocation_metadata or ()) if isinstance(v, str)}
        if method not in ROOT_METHODS and "traceparent" not in metadata:
            return handler
        name = _names(method)[0]
        attributes = _rpc_attributes(method)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _traced_unary(handler.unary_unary, name, attributes, metadata),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _traced_stream(handler.unary_stream, name, attributes, metadata),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # a stream of messages (ReportStream) traces each message itself: message_span


@contextlib.contextmanager
def message_span(method: str, traceparent: str) -> Iterator[Callable[[grpc.StatusCode], None]]:
    """The SERVER span of one message on a stream that carries each message's trace context in
    the message (ReportRequest.traceparent), named as the unary method it stands for; yields
    what records the message's status. No span without a context or with tracing off."""
    if not traceparent or not tracing.enabled():
        yield _no_status
        return
    span = _server_span(_names(method)[0], _rpc_attributes(method), {"traceparent": traceparent})
    codes: list[grpc.StatusCode] = []
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield codes.append
    finally:
        _set_status(span, codes[-1] if codes else grpc.StatusCode.UNKNOWN)
        span.end()


def _no_status(code: grpc.StatusCode) -> None:
    pass


def _server_span(name, attributes, metadata):
    parent = propagate.extract(metadata)
    return tracing.tracer().start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)


def _context_code(context) -> grpc.StatusCode | None:
    try:
        return context.code()
    except Exception:  # older grpc.aio contexts have no code()
        return None


def _traced_unary(behavior, name, attributes, metadata):
    async def handler(request, context):
        span = _server_span(name, attributes, metadata)
        code = None
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                response = await behavior(request, context)
            code = _context_code(context)
            return response
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except BaseException:
            code = _context_code(context) or grpc.StatusCode.UNKNOWN
            raise
        finally:
            _set_status(span, code)
            span.end()

    return handler


def _traced_stream(behavior, name, attributes, metadata):
    async def handler(request, context):
        span = _server_span(name, attributes, metadata)
        num_messages = 0
        code = None
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            async for response in behavior(request, context):
                num_messages += 1
                yield response
            code = _context_code(context)
        except (asyncio.CancelledError, GeneratorExit):
            code = grpc.StatusCode.CANCELLED
            raise
        except BaseException:
            code = _context_code(context) or grpc.StatusCode.UNKNOWN
            raise
        finally:
            otel_context.detach(token)
            span.set_attribute("kvplane.rpc.messages_sent", num_messages)
            _set_status(span, code)
            span.end()

    return handler


# -- client ---------------------------------------------------------------------------------------


def _with_context(details: grpc.aio.ClientCallDetails, span) -> grpc.aio.ClientCallDetails:
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    metadata = grpc.aio.Metadata(*(tuple(details.metadata) if details.metadata else ()), *carrier.items())
    return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials, details.wait_for_ready)


def _client_span(details, target: str):
    method = details.method.decode() if isinstance(details.method, bytes) else details.method
    attributes = _rpc_attributes(method)
    host, _, port = target.rpartition(":")
    if host:
        attributes["server.address"] = host
        if port.isdigit():
            attributes["server.port"] = int(port)
    return tracing.tracer().start_span(_names(method)[0], kind=SpanKind.CLIENT, attributes=attributes)


def _end_when_done(call, span) -> None:
    def done(c) -> None:
        end_ns = time.time_ns()

        async def finish() -> None:
            try:
                code = await c.code()
            except Exception:
                code = grpc.StatusCode.UNKNOWN
            _set_status(span, code)
            span.end(end_time=end_ns)

        try:
            asyncio.get_running_loop().create_task(finish())
        except RuntimeError:  # no loop left (shutdown): end without a status
            span.end(end_time=end_ns)

    call.add_done_callback(done)


class _ClientTracing:
    def __init__(self, target: str) -> None:
        self._target = target

    async def _intercept(self, continuation, details, request):
        if not trace.get_current_span().get_span_context().is_valid:
            return await continuation(details, request)
        span = _client_span(details, self._target)
        try:
            call = await continuation(_with_context(details, span), request)
        except BaseException:
            _set_status(span, grpc.StatusCode.UNKNOWN)
            span.end()
            raise
        _end_when_done(call, span)
        return call


class UnaryUnaryTracing(_ClientTracing, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await self._intercept(continuation, client_call_details, request)


class UnaryStreamTracing(_ClientTracing, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await self._intercept(continuation, client_call_details, request)


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    return [ServerTracingInterceptor()] if tracing.enabled() else []


def client_interceptors(target: str) -> Sequence[grpc.aio.ClientInterceptor] | None:
    if not tracing.enabled():
        return None
    return [UnaryUnaryTracing(target), UnaryStreamTracing(target)]
