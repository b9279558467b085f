"""Structured logs: one JSON object (or one logfmt line) per event, with the trace id when traced.

Levels are per component: a component is a logger-name prefix (`controlplane`,
`kvplane.controlplane.store`, `kvplane.dataplane.transport`, `kvplane.telemetry`, ...), the most specific prefix
wins, and `--log-level` sets the rest. Fields passed as `extra={...}` become keys of the line.
Logs carry ids, counts and timings, never prompt text.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping

from kvplane.telemetry import tracing

LOG_FORMATS = ("json", "logfmt", "text")
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def parse_log_levels(text: str) -> dict[str, str]:
    """'kvplane.controlplane=DEBUG,kvplane.dataplane.transport=warning' -> {'kvplane.controlplane': 'DEBUG', ...}; ValueError if bad."""
    levels: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        component, sep, level = item.partition("=")
        level = level.strip().upper()
        if not sep or not component.strip() or not isinstance(logging.getLevelName(level), int):
            raise ValueError(f"bad --log-levels entry {item!r}: expected COMPONENT=LEVEL, e.g. kvplane.controlplane=DEBUG")
        levels[component.strip()] = level
    return levels


def _fields(record: logging.LogRecord) -> dict:
    out = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
        "level": record.levelname,
        "logger": record.name,
        "msg": record.getMessage(),
    }
    ids = tracing.current_ids()
    if ids is not None:
        out["trace_id"], out["span_id"] = ids
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_"):
            out[key] = value
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str, separators=(",", ":"))


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = []
        for key, value in _fields(record).items():
            text = str(value)
            if not text or any(c in text for c in ' ="\n'):
                text = json.dumps(text)
            parts.append(f"{key}={text}")
        return " ".join(parts)


def configure_logging(level: str = "INFO", levels: Mapping[str, str] | None = None, fmt: str = "json") -> None:
    """Replaces the root handler with one structured stderr handler; sets per-component levels."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    elif fmt == "logfmt":
        handler.setFormatter(LogfmtFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for component, component_level in (levels or {}).items():
        logging.getLogger(component).setLevel(component_level)
