"""Exporter selection from the standard environment, flags, logs, and the tracing-off path."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from kvplane.telemetry import logs, tracing
from kvplane.telemetry.grpc_tracing import client_interceptors, server_interceptors
from kvplane.telemetry.metrics import SPECS
from kvplane.telemetry.setup import TelemetryConfig, _metrics_exporters_from_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"KVPLANE_TRACES_FILE": "/tmp/x.jsonl"}, ["file"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "KVPLANE_TRACES_FILE": "/tmp/x.jsonl"}, ["otlp", "file"]),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "KVPLANE_TRACES_FILE": "/x"}, []),
    ],
)
def test_span_exporters_follow_the_environment(env, expected):
    assert tracing.exporters_from_env(env) == expected


def test_unknown_span_exporter_is_an_error():
    with pytest.raises(ValueError, match="zipkin"):
        tracing.exporters_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_metric_exporters_follow_the_environment():
    assert _metrics_exporters_from_env({}) == []
    assert _metrics_exporters_from_env({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318"}) == ["otlp"]
    assert _metrics_exporters_from_env({"OTEL_METRICS_EXPORTER": "prometheus,otlp"}) == ["otlp"]
    assert _metrics_exporters_from_env({"OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"}) == []


def test_tracing_off_costs_no_interceptor_and_no_span():
    assert not tracing.enabled()
    assert server_interceptors() == []
    assert client_interceptors("127.0.0.1:1") is None
    assert tracing.span(tracing.SPAN_ROUTE) is tracing.NOOP_SPAN
    assert tracing.current_ids() is None


def test_one_monotonic_instant_is_one_span_time_and_follows_the_wall_clock(monkeypatch):
    """A queue's end and the prefill's start are one reading converted at two moments."""
    import time

    t = time.monotonic()
    first = tracing.mono_to_ns(t)
    for _ in range(1000):
        assert tracing.mono_to_ns(t) == first
    assert abs(first - time.time_ns()) < 50_000_000
    # A stepped wall clock (an hour ahead) moves later conversions with it.
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + 3600 * 10**9)
    assert tracing.mono_to_ns(t) - first == pytest.approx(3600 * 10**9, abs=50_000_000)


def test_log_levels_parse_and_reject_garbage():
    assert logs.parse_log_levels("kvplane.controlplane=debug, kvplane.dataplane.transport=WARNING") == {
        "kvplane.controlplane": "DEBUG", "kvplane.dataplane.transport": "WARNING",
    }  # fmt: skip
    assert logs.parse_log_levels("") == {}
    for bad in ("controlplane", "controlplane=LOUD", "=DEBUG"):
        with pytest.raises(ValueError, match="--log-levels"):
            logs.parse_log_levels(bad)


def test_config_validation():
    assert TelemetryConfig("s", metrics_port=-1).validate().metrics_port == -1
    with pytest.raises(ValueError, match="metrics port"):
        TelemetryConfig("s", metrics_port=-2).validate()
    with pytest.raises(ValueError, match="log level"):
        TelemetryConfig("s", log_level="chatty").validate()


def test_json_lines_carry_fields_and_per_component_levels():
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        logs.configure_logging("WARNING", {"kvtest.loud": "DEBUG"}, "json")
        stream = io.StringIO()
        root.handlers[0].setStream(stream)
        logging.getLogger("kvtest.loud.child").debug("shown", extra={"request_id": "r1", "tokens": 3})
        logging.getLogger("kvtest.quiet").info("hidden")
        [line] = stream.getvalue().splitlines()
        event = json.loads(line)
        assert event["msg"] == "shown" and event["level"] == "DEBUG" and event["logger"] == "kvtest.loud.child"
        assert (event["request_id"], event["tokens"]) == ("r1", 3)
        logs.configure_logging("INFO", {}, "logfmt")
        stream = io.StringIO()
        root.handlers[0].setStream(stream)
        logging.getLogger("kvtest.x").info("two words", extra={"n": 1})
        assert 'msg="two words"' in stream.getvalue() and "n=1" in stream.getvalue()
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        logging.getLogger("kvtest.loud").setLevel(logging.NOTSET)


def test_every_metric_and_span_name_is_documented():
    doc = DOC.read_text()
    for spec in SPECS:
        assert f"`{spec.name}`" in doc, spec.name
        assert f"`{spec.prometheus_name}`" in doc, spec.prometheus_name
    for name in tracing.INTERNAL_SPAN_NAMES:
        assert f"`{name}`" in doc, name
