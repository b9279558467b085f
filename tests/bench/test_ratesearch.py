"""The arithmetic of `kvplane bench controlplane` (kvplane/apps/bench/ratesearch.py)."""

from __future__ import annotations

import math

import pytest

from kvplane.apps.bench.ratesearch import (
    Limits,
    RateSearch,
    delta,
    histogram_quantile,
    label_values,
    phase_shares,
    sample_key,
    step_verdict,
    summed,
    window_ratio,
)


def test_below_capacity_every_arrival_completes_one_latency_later_so_the_window_ratio_is_one():
    arrivals = [i * 0.1 for i in range(60)]  # 10 req/s for 6 s
    latencies = [0.5] * 60
    completions = [a + 0.5 for a in arrivals]
    assert window_ratio(arrivals, completions, latencies, 6.0) == pytest.approx(1.0)


def test_above_capacity_the_window_ratio_falls_to_capacity_over_offered():
    arrivals = [i * 0.05 for i in range(120)]  # 20 req/s offered
    completions = [0.5 + i * 0.1 for i in range(120)]  # served at 10 req/s: a growing queue
    latencies = [c - a for a, c in zip(arrivals, completions, strict=True)]
    assert window_ratio(arrivals, completions, latencies, 6.0) == pytest.approx(0.5, abs=0.05)
    assert window_ratio([], [], [], 6.0) == 0.0


def test_a_step_is_sustained_only_without_errors_with_completions_kept_up_and_fast_routing():
    limits = Limits(min_ratio=0.95, max_routing_p99_ms=5.0)
    assert step_verdict(0, 0.97, 1.0, limits) == (True, "")
    assert step_verdict(2, 1.0, 1.0, limits) == (False, "2 requests failed")
    assert step_verdict(0, 0.9, 1.0, limits)[1].startswith("completions kept up with 90%")
    assert step_verdict(0, 1.0, 5.0, limits) == (False, "routing p99 5.00 ms >= 5 ms")
    with pytest.raises(ValueError):
        Limits(min_ratio=1.5).validate()


def test_the_search_doubles_then_bisects_down_to_the_resolution():
    search = RateSearch(start_rps=10, resolution=0.15, max_steps=20)
    capacity = 55.0
    tried = []
    while (rate := search.next_rate()) is not None:
        tried.append(rate)
        search.record(rate, rate <= capacity)
    assert tried == [10, 20, 40, 80, 60, 50, 55]
    assert search.best_rps == 55 and search.failed_rps == 60


def test_the_search_halves_when_even_the_first_rate_fails_and_stops_at_max_steps():
    search = RateSearch(start_rps=16, max_steps=3)
    for _ in range(3):
        search.record(search.next_rate(), False)
    assert [r for r, _ in search.history] == [16, 8, 4]
    assert search.next_rate() is None and search.best_rps is None


def test_histogram_quantile_interpolates_inside_the_bucket_as_prometheus_does():
    buckets = {0.001: 50.0, 0.002: 90.0, 0.005: 100.0, math.inf: 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.001)
    assert histogram_quantile(0.7, buckets) == pytest.approx(0.0015)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.0047)
    assert histogram_quantile(0.99, {0.001: 0.0, math.inf: 0.0}) is None
    assert histogram_quantile(0.99, {0.001: 1.0, math.inf: 10.0}) == 0.001  # in +Inf: the largest finite bound


def test_counters_of_several_replicas_are_differenced_summed_and_read_by_label():
    name = "kvplane_controlplane_cpu_seconds_total"
    route, relay = sample_key(name, {"kvplane_phase": "route"}), sample_key(name, {"kvplane_phase": "relay"})
    one = delta({route: 1.0, relay: 2.0}, {route: 1.5, relay: 3.0})
    two = delta({}, {route: 0.25, relay: 0.5})
    total = summed([one, two])
    assert label_values(total, name, "kvplane_phase") == {"route": 0.75, "relay": 1.5}
    shares = phase_shares({"route": 0.75, "relay": 1.5}, 3.0)
    assert shares == {"route": 0.25, "relay": 0.5, "other": 0.25}
    assert phase_shares({"route": 1.0}, 0.0) == {"route": 0.0, "other": 0.0}
