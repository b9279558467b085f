"""Summary statistics shared by the control plane's stats window and the benchmarks.

One percentile definition for the whole project: linear interpolation between the closest ranks
(numpy's default, "type 7"), so `kvplane top`, `GetStats` and every benchmark table agree on
what p50 and p99 mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (q in [0, 100]) of `values` (any order); None when there are none."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)  # linear time when already sorted
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
