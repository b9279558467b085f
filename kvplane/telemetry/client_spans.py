"""The SDK's side of a trace: one CLIENT span per Generate, its context sent as `traceparent`.

The SDK never configures OpenTelemetry: it uses the tracer provider passed to the client or,
by default, the application's global one. Without one (the OTel API's default) the span is a
non-recording no-op, nothing is injected, and the call goes out exactly as without tracing.
"""

from __future__ import annotations

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

GENERATE_SPAN = "kvplane.v1.Kvplane/Generate"


def tracer_for(tracer_provider=None) -> trace.Tracer:
    return trace.get_tracer("kvplane.client", tracer_provider=tracer_provider)


def start_generate(tracer: trace.Tracer, endpoint: str, request) -> tuple[trace.Span, list[tuple[str, str]] | None]:
    """(span, metadata carrying its context, or None when the span does not record)."""
    span = tracer.start_span(GENERATE_SPAN, kind=SpanKind.CLIENT)
    if not span.is_recording():
        return span, None
    host, _, port = endpoint.rpartition(":")
    span.set_attributes({
        "rpc.system": "grpc", "rpc.service": "kvplane.v1.Kvplane", "rpc.method": "Generate",
        "server.address": host or endpoint, "gen_ai.operation.name": "text_completion",
        "gen_ai.request.max_tokens": request.sampling.max_tokens,
    })  # fmt: skip
    if port.isdigit():
        span.set_attribute("server.port", int(port))
    if request.model:
        span.set_attribute("gen_ai.request.model", request.model)
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return span, list(carrier.items())


def end_generate(span: trace.Span, last_chunk, num_output_tokens: int, error: grpc.RpcError | None) -> None:
    if span.is_recording():
        code = error.code() if error is not None else grpc.StatusCode.OK
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, code.name))
        span.set_attribute("gen_ai.usage.output_tokens", num_output_tokens)
        if last_chunk is not None and last_chunk.metrics is not None:
            m = last_chunk.metrics
            span.set_attributes({
                "kvplane.request_id": m.request_id,
                "gen_ai.usage.input_tokens": m.prompt_tokens,
                "gen_ai.response.finish_reasons": [last_chunk.finish_reason],
                "kvplane.ttft_ms": m.ttft_ms,
            })  # fmt: skip
    span.end()
