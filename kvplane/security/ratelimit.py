"""Per-identity token buckets: at most `rate` calls a second on average, `burst` at once.

Bounded memory: at most `max_keys` buckets; when full, the longest-idle bucket is dropped (a
dropped bucket starts full again, which only ever favours a caller that has been quiet longest).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    def __init__(self, rate: float, burst: float, *, max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0 or burst < 1:
            raise ValueError(f"rate must be >= 0 (0 = no limit) and burst >= 1, got {rate} and {burst}")
        self.rate, self.burst = rate, burst
        self._max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    def acquire(self, key: str) -> float:
        """0.0 when the call may go ahead, else the seconds until a token is free."""
        if self.rate == 0:
            return 0.0
        now = self._clock()
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return wait
