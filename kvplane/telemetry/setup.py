"""One call per server process: logs, metrics (Prometheus endpoint, OTLP push), tracing.

Metrics: an OpenTelemetry meter provider with a Prometheus reader served over HTTP at
`http://HOST:METRICS_PORT/metrics`, beside the kubelet's /healthz and /readyz (probes.py) (port 0 = any free port, the default, so several servers
share a host; -1 = no endpoint), plus an OTLP exporter when OTEL_METRICS_EXPORTER says otlp or,
unset, when OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set.
Tracing: see kvplane.telemetry.tracing (off unless an exporter is configured).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvplane.telemetry import logs, metrics, probes, tracing

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 0  # any free port: one host runs many agents; deployments pin it (e.g. 9464)


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    service_name: str  # "kvplane-controlplane" or "kvplane-agent"
    instance_id: str = ""  # the worker id; the replica's host:port
    metrics_host: str = "127.0.0.1"
    metrics_port: int = DEFAULT_METRICS_PORT  # 0 = any free port, -1 = no Prometheus endpoint
    log_level: str = "INFO"
    log_levels: Mapping[str, str] = field(default_factory=dict)  # component (logger prefix) -> level
    log_format: str = "json"

    def validate(self) -> TelemetryConfig:
        if not -1 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics port must be in -1..65535 (0 = any free port, -1 = off), got {self.metrics_port}")
        if not isinstance(logging.getLevelName(self.log_level.upper()), int):
            raise ValueError(f"unknown log level {self.log_level!r}")
        if self.log_format not in logs.LOG_FORMATS:
            raise ValueError(f"log format must be one of {logs.LOG_FORMATS}, got {self.log_format!r}")
        return self


@dataclass(slots=True)
class _State:
    tracer_provider: object = None
    meter_provider: object = None
    http_server: object = None
    metrics_port: int | None = None


_state = _State()


def _metrics_exporters_from_env(env: Mapping[str, str]) -> list[str]:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    configured = env.get("OTEL_METRICS_EXPORTER", "").strip().lower()
    if configured:
        names = [n.strip() for n in configured.split(",") if n.strip() and n.strip() != "none"]
    else:
        names = ["otlp"] if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") else []
    # "prometheus" is the endpoint this module always serves (unless --metrics-port -1).
    return [n for n in names if n != "prometheus"]


def _resource(config: TelemetryConfig, env: Mapping[str, str]):
    from opentelemetry.sdk.resources import Resource

    attributes = {"service.namespace": "kvplane"}
    if not env.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = config.service_name
    if config.instance_id:
        attributes["service.instance.id"] = config.instance_id
    return Resource.create(attributes)  # merges OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME


def _metric_readers(config: TelemetryConfig, env: Mapping[str, str]) -> list:
    readers = []
    if config.metrics_port >= 0:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.append(PrometheusMetricReader())
        server = probes.start_http_server(config.metrics_port, config.metrics_host)  # also /healthz, /readyz
        _state.http_server = server
        _state.metrics_port = server.server_port
    for name in _metrics_exporters_from_env(env):
        if name != "otlp":
            raise ValueError(f"OTEL_METRICS_EXPORTER names unsupported exporter {name!r}; kvplane supports otlp, prometheus, none")
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        protocol = (env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))  # interval: OTEL_METRIC_EXPORT_INTERVAL
    return readers


def setup(config: TelemetryConfig, env: Mapping[str, str] | None = None) -> None:
    """Configures logs, metrics and tracing for this process (call once, before serving)."""
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider

    env = os.environ if env is None else env
    config.validate()
    logs.configure_logging(config.log_level, config.log_levels, config.log_format)
    resource = _resource(config, env)
    meter_provider = MeterProvider(metric_readers=_metric_readers(config, env), resource=resource)
    otel_metrics.set_meter_provider(meter_provider)
    _state.meter_provider = meter_provider
    metrics._reset_for_setup()
    exporters = tracing.exporters_from_env(env)
    if exporters:
        provider = tracing.make_tracer_provider(resource, exporters, env)
        trace.set_tracer_provider(provider)
        _state.tracer_provider = provider
        tracing._enable(provider)
    log.info(
        "telemetry ready",
        extra={"metrics_port": _state.metrics_port, "span_exporters": exporters or "none (tracing off)", "service": config.service_name},
    )


def metrics_port() -> int | None:
    return _state.metrics_port


def metrics_url(host: str) -> str:
    """http://HOST:PORT/metrics of this process's Prometheus endpoint, or '' when it has none."""
    if _state.metrics_port is None:
        return ""
    return f"http://{host}:{_state.metrics_port}/metrics"


def shutdown() -> None:
    """Flushes spans and metrics still buffered (servers call it on the way out)."""
    tracing._disable()
    for provider in (_state.tracer_provider, _state.meter_provider):
        if provider is not None:
            try:
                provider.shutdown()
            except Exception:  # never fail a shutdown on telemetry
                log.exception("telemetry shutdown failed")
    _state.tracer_provider = _state.meter_provider = None
    if _state.http_server is not None:
        _state.http_server.shutdown()
        _state.http_server = None
        _state.metrics_port = None
