"""The cyclic garbage collector, set for a long-running router.

Python collects its youngest generation every 700 net allocations. Planning one request at a
thousand workers allocates a few thousand small objects, so collections landed inside routing
decisions, and each one that reached the middle generation walked the objects that request
and its neighbours had built: 1.5-6 ms pauses, the whole of routing's p99 (`kvplane bench
routing`, 1,000 workers). The control plane's objects are not cyclic garbage in the common case
(reference counting frees them), so the young generation is collected every 20,000 allocations
instead, and whatever start-up built is frozen out of the collector's scans.
"""

from __future__ import annotations

import gc

YOUNG_GENERATION_THRESHOLD = 20_000  # Python's default is 700


def tune_for_serving() -> None:
    """After start-up: freeze what exists and collect the young generation less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, middle, old)
