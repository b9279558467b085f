"""Tracing: span helpers that cost nothing when tracing is off, exporters chosen from the environment.

Tracing is on in a process only when `setup()` found an exporter to send spans to:
OTEL_TRACES_EXPORTER (otlp, console; "none" turns it off; unset means otlp when
OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set), and/or
KVPLANE_TRACES_FILE (every finished span as one JSON line appended to that file; several
processes may share one file). OTEL_SDK_DISABLED=true turns everything off. Off means no tracer
provider, no gRPC interceptors, and `span()` returns one shared no-op object.

Context crosses processes as W3C `traceparent` gRPC metadata (the propagators of
OTEL_PROPAGATORS; tracecontext and baggage by default), injected and extracted by the
interceptors in `kvplane.telemetry.grpc_tracing`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

TRACES_FILE_ENV = "KVPLANE_TRACES_FILE"
TRACER_NAME = "kvplane"

# Span names (documented in docs/observability.md; tests check that they are).
SPAN_ROUTE = "kvplane.route"
SPAN_ADMISSION = "kvplane.admission"
SPAN_REMOTE_PREFILL = "kvplane.remote_prefill"
SPAN_KV_TRANSFER = "kvplane.kv_transfer"
SPAN_QUEUE = "kvplane.engine.queue"
SPAN_PREFILL = "kvplane.engine.prefill"
SPAN_DECODE = "kvplane.engine.decode"
INTERNAL_SPAN_NAMES = (SPAN_ROUTE, SPAN_ADMISSION, SPAN_REMOTE_PREFILL, SPAN_KV_TRANSFER, SPAN_QUEUE, SPAN_PREFILL, SPAN_DECODE)

_enabled = False
_tracer: trace.Tracer | None = None


def enabled() -> bool:
    return _enabled


def tracer() -> trace.Tracer:
    assert _tracer is not None, "tracing is off"
    return _tracer


def _enable(provider) -> None:
    global _enabled, _tracer
    _tracer = provider.get_tracer(TRACER_NAME)
    _enabled = True


def _disable() -> None:
    global _enabled, _tracer
    _enabled, _tracer = False, None


def exporters_from_env(env: Mapping[str, str] = os.environ) -> list[str]:
    """The span exporters the environment asks for: a subset of otlp, console, file."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names: list[str] = []
    configured = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if configured:
        names = [n.strip() for n in configured.split(",") if n.strip() and n.strip() != "none"]
    elif env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        names = ["otlp"]
    unknown = [n for n in names if n not in ("otlp", "console")]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER names unsupported exporters {unknown}; kvplane supports otlp, console, none")
    if env.get(TRACES_FILE_ENV):
        names.append("file")
    return names


# -- spans --------------------------------------------------------------------------------------


class _NoopSpan:
    """What `span()` yields when tracing is off: accepts and drops everything."""

    __slots__ = ()

    def __enter__(self) -> _NoopSpan:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def is_recording(self) -> bool:
        return False


NOOP_SPAN = _NoopSpan()


def span(name: str, attributes: Mapping[str, Any] | None = None, kind: SpanKind = SpanKind.INTERNAL):
    """A context manager opening a child of the current span (made current), or the no-op span."""
    if not _enabled:
        return NOOP_SPAN
    return _tracer.start_as_current_span(name, kind=kind, attributes=attributes)


def record_span(name: str, start_mono: float, end_mono: float, attributes: Mapping[str, Any] | None = None) -> None:
    """Records an already finished interval (monotonic seconds) as a child of the current span."""
    if not _enabled:
        return
    s = _tracer.start_span(name, start_time=mono_to_ns(start_mono), attributes=attributes)
    s.end(end_time=mono_to_ns(end_mono))


# Wall clock minus monotonic clock, in ns, kept per process. Sampling it afresh for every
# conversion gave one instant (a queue's end, the prefill's start) two readings a few us
# apart; both clocks are slewed alike by NTP, so the offset changes only when the wall clock
# is stepped, and it is taken again then.
_STEP_NS = 1_000_000


def _wall_minus_mono() -> int:
    """The offset from the tightest of three (monotonic, wall, monotonic) readings: a process
    preempted between two reads would otherwise keep a skewed offset for its whole life."""
    best_gap, offset = None, 0
    for _ in range(3):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        if best_gap is None or after - before < best_gap:
            best_gap, offset = after - before, wall - (before + after) // 2
    return offset


_wall_minus_mono_ns = _wall_minus_mono()


def mono_to_ns(t: float) -> int:
    """A time.monotonic() reading as wall-clock nanoseconds since the epoch (what spans carry).

    One instant converts to one value within a process, whenever it is converted."""
    global _wall_minus_mono_ns
    if abs(time.time_ns() - time.monotonic_ns() - _wall_minus_mono_ns) > _STEP_NS:
        # Stepped, or this reading was preempted: a careful reading decides.
        _wall_minus_mono_ns = _wall_minus_mono()
    return int(t * 1e9) + _wall_minus_mono_ns


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) in hex of the current span, or None outside a sampled span."""
    if not _enabled:
        return None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


# -- the JSON-lines file exporter -----------------------------------------------------------------


def span_to_json(s) -> dict[str, Any]:
    ctx = s.get_span_context()
    parent = s.parent
    return {
        "name": s.name,
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_span_id": format(parent.span_id, "016x") if parent is not None else None,
        "kind": s.kind.name,
        "start_ns": s.start_time,
        "end_ns": s.end_time,
        "status": s.status.status_code.name,
        "attributes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in (s.attributes or {}).items()},
        "service": s.resource.attributes.get("service.name", ""),
        "instance": s.resource.attributes.get("service.instance.id", ""),
        "pid": os.getpid(),
    }


class JsonLinesSpanExporter:
    """Appends each finished span to a file as one JSON line (one write per batch: safe to share)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        data = "".join(json.dumps(span_to_json(s), separators=(",", ":")) + "\n" for s in spans).encode()
        with self._lock:
            fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def make_span_exporter(name: str, env: Mapping[str, str] = os.environ):
    if name == "file":
        return JsonLinesSpanExporter(env[TRACES_FILE_ENV])
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    else:
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} is not supported; use grpc or http/protobuf")
    return OTLPSpanExporter()


def make_tracer_provider(resource, exporter_names: Sequence[str], env: Mapping[str, str] = os.environ):
    """An SDK tracer provider batching finished spans to each named exporter."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=resource)
    for name in exporter_names:
        # Batch delay and sizes follow OTEL_BSP_* (e.g. OTEL_BSP_SCHEDULE_DELAY in ms).
        provider.add_span_processor(BatchSpanProcessor(make_span_exporter(name, env)))
    return provider
