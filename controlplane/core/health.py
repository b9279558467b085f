"""Worker health as routing sees it: which workers are out of routing right now, and why.

Three rules, all about progress:
- **failed**: a request on the worker failed because of the worker (its connection refused or
  reset, it answered UNAVAILABLE). The worker is out until a load report newer than the failure
  arrives (a restarted agent reports within a fraction of a second; a dead one never does, and
  its lease ends it), so one dead worker does not cost every request an attempt.
- **stalled**: a request on the worker made no progress in time (no first token, no next token:
  the servicer's progress timeouts). The worker is out for `stalled_for_s` whatever it reports
  (a wedged engine beside a live event loop still reports); if it is still stuck when it comes
  back, the next request stalls again and puts it out again.
- **silent**: the worker's load reports (every 0.2 s from a live agent) stopped `silent_after_s`
  ago while reports demonstrably kept getting through since (the store and the bus,
  controlplane/bus/, answered, and other workers' reports arrived: the view's `store_ok_at`): a
  stopped or wedged agent keeps its lease until the TTL runs out, but must not get new requests
  meanwhile. That must hold at least `silent_after_s` after the worker's last report, so that an
  outage of the store, the bus or the replica's watch, which stops every report at once, never
  empties the cluster: routing then goes on with the last known state.

Plain data in, plain data out: `now` and the store's last success are passed in (monotonic seconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kvplane.controlplane.core.params import check_numbers, param
from kvplane.controlplane.core.pool import table_of
from kvplane.controlplane.core.views import ClusterView
from kvplane.types import WorkerId


@dataclass(frozen=True, slots=True)
class HealthConfig:
    silent_after_s: float = param(
        3.0,
        "a worker whose load reports stop this long (while the store answers and other workers' reports arrive) is taken out of routing",
    )
    stalled_for_s: float = param(30.0, "a worker that stalled a request (no first or next token in time) stays out of routing this long")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_numbers(self, positive=("silent_after_s", "stalled_for_s"))


class WorkerHealth:
    __slots__ = ("config", "_stalled_until", "_failed_at")

    def __init__(self, config: HealthConfig) -> None:
        self.config = config
        self._stalled_until: dict[WorkerId, float] = {}
        self._failed_at: dict[WorkerId, float] = {}

    def failed(self, worker_id: WorkerId, now: float) -> None:
        """A request failed because of `worker_id`: out of routing until it reports after `now`."""
        self._failed_at[worker_id] = now

    def stalled(self, worker_id: WorkerId, now: float) -> None:
        """A request on `worker_id` made no progress in time: out of routing for stalled_for_s."""
        self._stalled_until[worker_id] = now + self.config.stalled_for_s

    def forget(self, worker_id: WorkerId) -> None:
        self._stalled_until.pop(worker_id, None)
        self._failed_at.pop(worker_id, None)

    def excluded(self, cluster: ClusterView, now: float) -> Mapping[WorkerId, str]:
        """Workers out of routing at `now`, each with the reason in words. Only the workers that
        stalled or failed a request, or whose reports stopped, are looked at one by one; a stall
        or failure that is over is forgotten then (`now` does not go back: the planner's clock)."""
        table = table_of(cluster)
        silent_after, store_ok_at = self.config.silent_after_s, cluster.store_ok_at
        rows = {table.row_of[w] for w in (*self._stalled_until, *self._failed_at) if w in table.row_of}
        if store_ok_at is not None:
            reported_at = table.reported_at  # NaN (never reported): never silent
            rows.update(np.flatnonzero((now - reported_at > silent_after) & (store_ok_at - reported_at > silent_after)).tolist())
        out: dict[WorkerId, str] = {}
        for row in sorted(rows):
            w = table.views[row]
            until = self._stalled_until.get(w.worker_id)
            failed_at = self._failed_at.get(w.worker_id)
            if until is not None and now >= until:  # over: forgotten, so that requests do not walk every worker that ever stalled
                del self._stalled_until[w.worker_id]
            if failed_at is not None and w.reported_at is not None and w.reported_at > failed_at:  # reported since: over too
                del self._failed_at[w.worker_id]
                failed_at = None
            if until is not None and now < until:
                out[w.worker_id] = f"stalled a request {self.config.stalled_for_s - (until - now):.1f} s ago"
            elif failed_at is not None:
                out[w.worker_id] = f"failed a request {now - failed_at:.1f} s ago and has not reported since"
            elif (
                w.reported_at is not None
                and store_ok_at is not None
                and now - w.reported_at > silent_after
                and store_ok_at - w.reported_at > silent_after
            ):
                out[w.worker_id] = f"no load report for {now - w.reported_at:.1f} s"
        return out
