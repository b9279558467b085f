"""How far the planner believes a worker's load reports: not beyond the latency it measures there.

A worker's load report is its own claim (issue 28: a compromised worker reported itself idle to
pull traffic). The planner predicts a request's time to first token from that report and then
measures it; when the measured times run far above the predicted, the report understated the
worker's load, and it is discounted.

Rule: per worker, over the requests this replica prefilled there (a disaggregated request's
first token also waits on another worker, so those do not count), exponentially weighted means
(`weight` for the newest) of the predicted and the measured TTFT. The worker's reports are
*contradicted* when the measured mean exceeds `ratio` x the predicted mean and exceeds it by at
least `min_excess_s` (small predictions jitter by more than their ratio), and at least
`min_requests` of the last RECENT requests there each ran past both bounds. One slow request
is not evidence (a restarted worker's first, its warm-up; a pause of the machine): discounting
on one moved every reader of a prefix holder's prefix elsewhere for `hold_s` (seen on a loaded
machine: a test's restarted worker, a holder losing a loop of agent steps). A worker that
understates its load is caught at its second late request, also one that serves every other
request fast. While contradicted, and
for `hold_s` after the last request that showed it, the worker's view gets the excess (measured -
predicted mean) as queued prefill work, priced in tokens with the worker's own step-time model:
the queue its latency shows, which the cost, the load guard and the predictions then all see.
After `hold_s` without a new request there the report stands again, so a worker that recovered
gets traffic back (and is measured again). Where predictive admission would refuse a request
only because of a discount, the planner admits one request at a time there to measure it again
(planner.Planner._probe): otherwise a worker serving alone is refused everything for `hold_s`.

The prediction a request is measured against is the one made from the report alone: the
discount in force at dispatch is taken out of it (`observe(..., discount_s)`), or the discount
would explain away the excess that caused it and flip on and off; and the planner passes the
prediction before its calibration, which learns from the same requests: when one worker's late
requests are most of what it saw (a holder serving a loop, a liar drawing the traffic) it
predicts them late, on every worker, and against it the worker was late once and then never.
Honest workers are unaffected: their measured times track the predictions from their reports
(the step-time model each fits from its own steps), far inside a 3x ratio and a 0.25 s margin.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from kvplane.controlplane.core.params import check_numbers, param
from kvplane.controlplane.core.pool import WorkerTable
from kvplane.controlplane.core.views import WorkerView
from kvplane.latency import prefill_attention
from kvplane.types import WorkerId

log = logging.getLogger(__name__)

RECENT = 8  # the requests whose lateness is remembered per worker
_RECENT_MASK = (1 << RECENT) - 1


@dataclass(frozen=True, slots=True)
class TrustConfig:
    report_contradiction_ratio: float = param(
        3.0, "a worker's load reports are discounted when its measured TTFT averages above this multiple of the predicted"
    )
    report_contradiction_min_s: float = param(0.25, "... and above the predicted by at least this many seconds")
    report_contradiction_weight: float = param(0.3, "weight of the newest request in those TTFT averages")
    report_contradiction_hold_s: float = param(30.0, "a discount lasts this long after the last request that showed it")
    report_contradiction_min_requests: int = param(
        2, f"... and only once this many of the worker's last {RECENT} requests each ran past both bounds (one slow request is no evidence)"
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_numbers(
            self,
            integers=("report_contradiction_min_requests",),
            positive=("report_contradiction_hold_s", "report_contradiction_min_requests"),
        )
        if self.report_contradiction_min_requests > RECENT:
            raise ValueError(f"report_contradiction_min_requests must be <= {RECENT}, got {self.report_contradiction_min_requests}")
        if self.report_contradiction_ratio < 1:
            raise ValueError(f"report_contradiction_ratio must be >= 1, got {self.report_contradiction_ratio}")
        if not 0 < self.report_contradiction_weight <= 1:
            raise ValueError(f"report_contradiction_weight must be in (0, 1], got {self.report_contradiction_weight}")


@dataclass(slots=True)
class _Means:
    predicted_s: float
    measured_s: float
    at: float  # when the last request was measured
    recent: int  # bit i: the i-th request before the last ran past both bounds (RECENT of them)


class ReportTrust:
    __slots__ = ("config", "enabled", "_means", "_contradicted")

    def __init__(self, config: TrustConfig) -> None:
        self.config = config
        # Off: nothing is learnt, so no worker is discounted (kvplane sim runs the other routing
        # policies so: their routers take the reports as they come).
        self.enabled = True
        self._means: dict[WorkerId, _Means] = {}
        # The workers discounted after their last request: a discount starts only there and ends
        # there or hold_s later, so a request looks at these, not at every worker measured (at
        # 1,000 workers that walk cost 0.23-0.27 ms per request).
        self._contradicted: set[WorkerId] = set()

    def observe(self, worker_id: WorkerId, predicted_s: float, measured_s: float, now: float, discount_s: float = 0.0) -> None:
        """A request prefilled on `worker_id` was predicted `predicted_s` before the planner's
        calibration (with `discount_s` of this module's discount in it) and took `measured_s` to
        its first token."""
        if not self.enabled:
            return
        predicted_s = max(predicted_s - discount_s, 0.0)
        late = self._past_bounds(predicted_s, measured_s)
        means = self._means.get(worker_id)
        if means is None:
            self._means[worker_id] = _Means(predicted_s, measured_s, now, int(late))
            self._note(worker_id, now)
            return
        was_discounted = self.excess_s(worker_id, now) > 0
        w = self.config.report_contradiction_weight
        means.predicted_s += w * (predicted_s - means.predicted_s)
        means.measured_s += w * (measured_s - means.measured_s)
        means.at = now
        means.recent = (means.recent << 1 | late) & _RECENT_MASK
        excess = self._note(worker_id, now)
        if excess > 0 and not was_discounted:  # an operator's only other sign is where traffic goes
            log.warning(
                "worker %s: its load reports are discounted (+%.2f s of queue): %d of its last %d requests here took over %gx the TTFT "
                "predicted from them and %.2f s more (mean %.3f s measured vs %.3f s predicted); for %.0f s after the last",
                worker_id, excess, means.recent.bit_count(), RECENT, self.config.report_contradiction_ratio, self.config.report_contradiction_min_s,
                means.measured_s, means.predicted_s, self.config.report_contradiction_hold_s,
            )  # fmt: skip

    def _note(self, worker_id: WorkerId, now: float) -> float:
        """The worker's discount after a request measured there, kept in `_contradicted`."""
        excess = self.excess_s(worker_id, now)
        if excess > 0:
            self._contradicted.add(worker_id)
        else:
            self._contradicted.discard(worker_id)
        return excess

    def excess_s(self, worker_id: WorkerId, now: float) -> float:
        """Seconds of queue the worker's reports leave out (0 while they are believed)."""
        means = self._means.get(worker_id)
        c = self.config
        if (
            means is None
            or now - means.at > c.report_contradiction_hold_s
            or means.recent.bit_count() < c.report_contradiction_min_requests
        ):
            return 0.0
        return means.measured_s - means.predicted_s if self._past_bounds(means.predicted_s, means.measured_s) else 0.0

    def _past_bounds(self, predicted_s: float, measured_s: float) -> bool:
        c = self.config
        return measured_s > c.report_contradiction_ratio * predicted_s and measured_s - predicted_s >= c.report_contradiction_min_s

    def num_discounted(self, now: float) -> int:
        """Workers whose reports are discounted now (the kvplane.workers.discounted gauge). Read
        at a metrics scrape, on another thread: it only reads (`list` copies the set at once)."""
        return sum(self.excess_s(worker_id, now) > 0 for worker_id in list(self._contradicted))

    @property
    def may_discount(self) -> bool:
        """Some worker may be discounted now (False: none is, without looking at any)."""
        return bool(self._contradicted)

    def forget(self, worker_id: WorkerId) -> None:
        self._means.pop(worker_id, None)
        self._contradicted.discard(worker_id)

    def discounted(self, table: WorkerTable, now: float) -> WorkerTable:
        """`table` with every contradicted worker's view carrying its excess as queued prefill work."""
        if not self.may_discount:
            return table
        rows = {}
        for worker_id in list(self._contradicted):
            excess = self.excess_s(worker_id, now)
            if excess <= 0:  # lapsed: `now` does not go back (the planner's clock), so for good
                self._contradicted.discard(worker_id)
                continue
            row = table.row_of.get(worker_id)
            if row is not None:
                rows[row] = with_excess(table.views[row], excess)
        return table.with_loads(rows) if rows else table


def with_excess(view: WorkerView, excess_s: float) -> WorkerView:
    """`view` with `excess_s` seconds of prefill added to its queue (in tokens at the worker's own
    prefill rate; unchanged when it has no step-time model, then nothing was predicted either)."""
    model = view.latency
    chunk = max(view.chunk_tokens, 1)
    step_s = model.step_seconds(prefill_tokens=chunk, prefill_attention=prefill_attention(chunk, 0)) if model is not None else 0.0
    if step_s <= 0:
        return view
    tokens = int(excess_s / step_s * chunk)
    load = dataclasses.replace(view.load, num_queued_prefill_tokens=view.load.num_queued_prefill_tokens + tokens)
    return dataclasses.replace(view, load=load)
