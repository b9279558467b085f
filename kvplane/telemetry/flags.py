"""The observability flags every server shares: --metrics-port, --log-level, --log-levels, --log-format."""

from __future__ import annotations

import argparse

from kvplane.telemetry.logs import LOG_FORMATS, parse_log_levels
from kvplane.telemetry.setup import DEFAULT_METRICS_PORT, TelemetryConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        help="port of the Prometheus endpoint /metrics and the plaintext probes /readyz, /healthz on --host: 0 = any free port "
        "(published as metrics_url), -1 = none; pin it in deployments, e.g. 9464 (default %(default)s)",
    )
    parser.add_argument("--log-level", default="INFO", help="Python logging level (default %(default)s)")
    parser.add_argument(
        "--log-levels",
        default="",
        metavar="COMPONENT=LEVEL,...",
        help="per-component levels, e.g. kvplane.controlplane.store=DEBUG,kvplane.dataplane.transport=WARNING",
    )
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="json",
                        help="one JSON object per line, logfmt, or plain text (default %(default)s)")  # fmt: skip


def config_from_args(args: argparse.Namespace, service_name: str, instance_id: str, host: str) -> TelemetryConfig:
    """Raises ValueError on a bad flag value."""
    return TelemetryConfig(
        service_name=service_name,
        instance_id=instance_id,
        metrics_host=host,
        metrics_port=args.metrics_port,
        log_level=args.log_level,
        log_levels=parse_log_levels(args.log_levels),
        log_format=args.log_format,
    ).validate()
