"""The arithmetic of `kvplane bench controlplane`: when a step's rate is sustained, which rate to
try next, and what the control plane's counters say about a step. Plain functions, no I/O.

Sustained (one step of `duration_s` at an offered Poisson rate): no request failed or timed out,
completions kept up with arrivals (`window_ratio` >= `min_ratio`, default 0.95), and the servers'
routing p99 (route + admit) stayed under `max_routing_p99_ms` (default 5 ms).

window_ratio: completions in the steady window [duration_s / 3, duration_s] divided by arrivals
in the same window shifted back by the median latency. Below capacity each arrival completes
about one median latency later, so the ratio is ~1 whatever the latency; above it completions
run at capacity while arrivals run at the offered rate, so it falls to ~capacity / offered.
(Comparing completions with the nominal rate instead would count Poisson noise, and counting
everything that completed before a drain deadline would pass any overload a long drain absorbs.)

Search: start at `start_rps`, double while sustained; after the first failure, bisect between the
highest sustained and the lowest failed rate until they are within `resolution` (default 15 %) of
each other or `max_steps` steps have run. The answer is the highest sustained rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvplane.stats import percentile


@dataclass(frozen=True, slots=True)
class Limits:
    min_ratio: float = 0.95
    max_routing_p99_ms: float = 5.0

    def validate(self) -> Limits:
        if not 0 < self.min_ratio <= 1:
            raise ValueError(f"min_ratio must be in (0, 1], got {self.min_ratio}")
        if not self.max_routing_p99_ms > 0:
            raise ValueError(f"max_routing_p99_ms must be positive, got {self.max_routing_p99_ms}")
        return self


def window_ratio(arrivals_s: Sequence[float], completions_s: Sequence[float], latencies_s: Sequence[float], duration_s: float) -> float:
    """Completions in [duration_s / 3, duration_s] / arrivals in that window shifted back by the
    median latency (times in seconds from the step's start; see the module docstring). 0.0 when
    nothing arrived in the shifted window."""
    median = percentile(latencies_s, 50) if latencies_s else 0.0
    start = duration_s / 3
    shift = min(median, start)  # a window before the step's start would hold no arrivals
    arrived = sum(start - shift <= t < duration_s - shift for t in arrivals_s)
    completed = sum(start <= t < duration_s for t in completions_s)
    return completed / arrived if arrived else 0.0


def step_verdict(num_errors: int, ratio: float, routing_p99_ms: float | None, limits: Limits) -> tuple[bool, str]:
    """(sustained, why not: '' when sustained)."""
    if num_errors:
        return False, f"{num_errors} requests failed"
    if ratio < limits.min_ratio:
        return False, f"completions kept up with {ratio * 100:.0f}% of arrivals (< {limits.min_ratio * 100:.0f}%)"
    if routing_p99_ms is not None and routing_p99_ms >= limits.max_routing_p99_ms:
        return False, f"routing p99 {routing_p99_ms:.2f} ms >= {limits.max_routing_p99_ms:g} ms"
    return True, ""


@dataclass(slots=True)
class RateSearch:
    """Doubling, then bisection (module docstring). `next_rate()` is None once the search is done."""

    start_rps: float
    resolution: float = 0.15
    max_steps: int = 10
    best_rps: float | None = None  # highest sustained
    failed_rps: float | None = None  # lowest failed
    history: list[tuple[float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.start_rps > 0 or not self.resolution > 0 or self.max_steps < 1:
            raise ValueError("start_rps and resolution must be positive and max_steps at least 1")

    def next_rate(self) -> float | None:
        if len(self.history) >= self.max_steps:
            return None
        if self.failed_rps is None:
            return self.start_rps if self.best_rps is None else self.best_rps * 2
        if self.best_rps is None:
            # Even the first rate failed: halve down (a floor of 1/16 of the start ends it).
            return None if self.failed_rps <= self.start_rps / 16 else self.failed_rps / 2
        if self.failed_rps <= self.best_rps * (1 + self.resolution):
            return None
        return (self.best_rps + self.failed_rps) / 2

    def record(self, rate_rps: float, sustained: bool) -> None:
        self.history.append((rate_rps, sustained))
        if sustained:
            self.best_rps = max(rate_rps, self.best_rps or 0.0)
        else:
            self.failed_rps = rate_rps if self.failed_rps is None else min(rate_rps, self.failed_rps)


# ---------------------------------------------------------------------------------------------
# The control plane's counters (Prometheus samples: name{label="v",...} -> value), differenced.


def sample_key(name: str, labels: Mapping[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """after - before, per sample (a sample missing before counts from 0)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def summed(samples: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Samples of several processes (replicas) added up key by key."""
    out: dict[str, float] = {}
    for one in samples:
        for k, v in one.items():
            out[k] = out.get(k, 0.0) + v
    return out


def label_values(samples: Mapping[str, float], name: str, label: str) -> dict[str, float]:
    """{value of `label`: sample} for the samples of metric `name`."""
    out = {}
    prefix = name + "{"
    for key, value in samples.items():
        if key.startswith(prefix):
            for part in key[len(prefix) : -1].split(","):
                k, _, v = part.partition("=")
                if k == label:
                    out[v.strip('"')] = value
    return out


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The q-quantile (0..1) of a cumulative histogram {upper bound: count} (+inf included), by
    linear interpolation inside the bucket, as Prometheus' histogram_quantile; None when empty.
    A quantile in the +inf bucket is reported as the largest finite bound."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def phase_shares(phase_cpu_s: Mapping[str, float], total_cpu_s: float) -> dict[str, float]:
    """Each phase's share of the process CPU, plus `other` (gRPC, asyncio, the rest: never below 0)."""
    if total_cpu_s <= 0:
        return {**dict.fromkeys(phase_cpu_s, 0.0), "other": 0.0}
    shares = {phase: seconds / total_cpu_s for phase, seconds in phase_cpu_s.items()}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares
