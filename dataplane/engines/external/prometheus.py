"""A reader for the Prometheus text exposition format (what vLLM serves on /metrics), pure.

Only what the adapters need: sample lines `name{label="value",...} number`, comments skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> Iterator[Sample]:
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        yield Sample(name, {k: v.replace('\\"', '"') for k, v in _LABEL.findall(labels or "")}, number)


def first(samples: list[Sample], name: str) -> Sample | None:
    return next((s for s in samples if s.name == name), None)


def total(samples: list[Sample], name: str) -> float:
    return sum(s.value for s in samples if s.name == name)
