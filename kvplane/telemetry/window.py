"""A short sliding window of per-worker request samples, for `kvplane top` (no gRPC, no OTel).

Rule: each finished request adds its TTFT to the decode worker and, when disaggregated, to the
prefill worker; its inter-token gaps and KV bytes pulled to the decode worker; its prompt and
cached token counts to the worker that prefilled it (where the cache hit or missed). Samples older than `horizon_s` are dropped; each
series keeps at most `max_samples` (oldest dropped first), so memory stays bounded under load.
Percentiles (kvplane.stats) interpolate over the samples inside the asked window.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvplane.stats import percentile


@dataclass(frozen=True, slots=True)
class Summary:
    count: int = 0
    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0

    @staticmethod
    def of(values: Sequence[float]) -> Summary:
        if not values:
            return Summary()
        s = sorted(values)
        p50, p90, p99 = (percentile(s, q) for q in (50, 90, 99))
        return Summary(len(s), sum(s) / len(s), p50, p90, p99)


@dataclass(frozen=True, slots=True)
class WorkerStats:
    worker_id: str
    num_requests: int
    ttft_s: Summary
    itl_s: Summary
    prompt_tokens: int
    cached_tokens: int
    kv_transfer_bytes: int

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(slots=True)
class _Series:
    requests: deque = field(default_factory=deque)  # (t, ttft_s | None, prompt_tokens, cached_tokens, kv_bytes)
    gaps: deque = field(default_factory=deque)  # (t, seconds)


class StatsWindow:
    def __init__(self, horizon_s: float = 300.0, max_samples: int = 20_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.horizon_s = horizon_s
        self._max = max_samples
        self._clock = clock
        self._series: dict[str, _Series] = {}

    def _get(self, worker_id: str) -> _Series:
        series = self._series.get(worker_id)
        if series is None:
            series = self._series[worker_id] = _Series(deque(maxlen=self._max), deque(maxlen=self._max))
        return series

    def add_request(
        self,
        decode_worker: str,
        prefill_worker: str,
        ttft_s: float | None,
        gaps_s: Sequence[float],
        prompt_tokens: int,
        cached_tokens: int,
        kv_transfer_bytes: int,
    ) -> None:
        now = self._clock()
        prefill_worker = prefill_worker or decode_worker
        decode = self._get(decode_worker)
        if prefill_worker == decode_worker:
            decode.requests.append((now, ttft_s, prompt_tokens, cached_tokens, 0))
        else:
            decode.requests.append((now, ttft_s, 0, 0, kv_transfer_bytes))
            self._get(prefill_worker).requests.append((now, ttft_s, prompt_tokens, cached_tokens, 0))
        decode.gaps.extend((now, g) for g in gaps_s)
        self._expire(now)

    def _expire(self, now: float) -> None:
        cutoff = now - self.horizon_s
        for worker_id in list(self._series):
            series = self._series[worker_id]
            for q in (series.requests, series.gaps):
                while q and q[0][0] < cutoff:
                    q.popleft()
            if not series.requests and not series.gaps:
                del self._series[worker_id]

    def stats(self, window_s: float | None = None) -> list[WorkerStats]:
        now = self._clock()
        self._expire(now)
        cutoff = now - min(window_s or self.horizon_s, self.horizon_s)
        out = []
        for worker_id in sorted(self._series):
            series = self._series[worker_id]
            reqs = [r for r in series.requests if r[0] >= cutoff]
            out.append(
                WorkerStats(
                    worker_id=worker_id,
                    num_requests=len(reqs),
                    ttft_s=Summary.of([r[1] for r in reqs if r[1] is not None]),
                    itl_s=Summary.of([g for t, g in series.gaps if t >= cutoff]),
                    prompt_tokens=sum(r[2] for r in reqs),
                    cached_tokens=sum(r[3] for r in reqs),
                    kv_transfer_bytes=sum(r[4] for r in reqs),
                )
            )
        return out
