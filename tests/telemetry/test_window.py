"""StatsWindow: attribution, percentiles, expiry, bounds."""

from __future__ import annotations

import pytest

from kvplane.telemetry.window import StatsWindow, Summary


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_summary_of_values():
    s = Summary.of([0.3, 0.1, 0.2])
    assert (s.count, s.p50) == (3, 0.2)
    assert s.p99 == pytest.approx(0.298)  # 0.2 + 0.98 x (0.3 - 0.2): interpolated
    assert s.mean == pytest.approx(0.2)
    assert Summary.of([]) == Summary()


def test_disaggregated_request_is_attributed_to_both_workers():
    window = StatsWindow(clock=Clock())
    window.add_request("decode-0", "prefill-0", 0.05, [0.01, 0.02], prompt_tokens=100, cached_tokens=32, kv_transfer_bytes=4096)
    by_id = {s.worker_id: s for s in window.stats()}
    decode, prefill = by_id["decode-0"], by_id["prefill-0"]
    assert decode.ttft_s.count == prefill.ttft_s.count == 1
    assert decode.itl_s.count == 2 and prefill.itl_s.count == 0
    assert (prefill.prompt_tokens, prefill.cached_tokens, prefill.cache_hit_rate) == (100, 32, 0.32)
    assert (decode.prompt_tokens, decode.kv_transfer_bytes) == (0, 4096)


def test_local_request_counts_once_on_its_worker():
    window = StatsWindow(clock=Clock())
    window.add_request("both-0", "", 0.02, [0.01], prompt_tokens=50, cached_tokens=0, kv_transfer_bytes=0)
    [stats] = window.stats()
    assert (stats.worker_id, stats.num_requests, stats.prompt_tokens) == ("both-0", 1, 50)


def test_old_samples_leave_the_window():
    clock = Clock()
    window = StatsWindow(horizon_s=60, clock=clock)
    window.add_request("d", "", 1.0, [0.5], 10, 0, 0)
    clock.now += 30
    window.add_request("d", "", 2.0, [0.1], 10, 5, 0)
    [both] = window.stats()
    assert both.ttft_s.count == 2
    [recent] = window.stats(window_s=10)
    assert (recent.ttft_s.count, recent.ttft_s.p50, recent.itl_s.count, recent.cached_tokens) == (1, 2.0, 1, 5)
    clock.now += 61
    assert window.stats() == []


def test_series_are_bounded():
    window = StatsWindow(max_samples=10, clock=Clock())
    window.add_request("d", "", 0.1, [0.001] * 50, 1, 0, 0)
    [stats] = window.stats()
    assert stats.itl_s.count == 10
