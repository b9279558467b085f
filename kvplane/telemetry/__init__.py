"""Observability for every kvplane process: traces, metrics, structured logs.

- `setup(...)` (servers call it once at startup) configures what the environment and flags ask
  for: OpenTelemetry tracing when an exporter is configured (standard OTEL_* variables, or
  KVPLANE_TRACES_FILE), metrics served on a Prometheus endpoint and pushed over OTLP when an
  endpoint is set, and one-line JSON logs with per-component levels.
- `tracing.span(...)` opens an internal span; when tracing is off it returns a shared no-op
  object and no interceptor is installed, so the request path pays one branch per span site.
- `instruments()` holds every metric instrument; the names, units and buckets live in
  `metrics.SPECS`, the single source that docs/observability.md and the tests follow.
"""

from kvplane.telemetry import tracing
from kvplane.telemetry.metrics import instruments
from kvplane.telemetry.setup import TelemetryConfig, metrics_url, setup, shutdown

__all__ = ["TelemetryConfig", "instruments", "metrics_url", "setup", "shutdown", "tracing"]
