"""Prefill inflow: the prefill work this replica has been sending each worker, per second.

A decode's steps also carry the prefill chunks of the requests that arrive after it (chunked
prefill co-schedules them), so its time per output token is not one decode step but

    TPOT = (step - slack) / (1 - inflow),  never below step, at most step + one full chunk's work,

where inflow is the prefill work (seconds of compute beyond the steps' own, StepTimeModel.
stream_work_seconds: every token of each prompt) arriving at the worker per second and slack the
work a step computes within its own time (c1 x the model's kink, once a step): over a decode of
n tokens lasting D = n x TPOT, the steps take n x (step - slack) plus the inflow x D of prefill
that arrives meanwhile (predictor.shared_step_seconds). A
step carries at most one chunk (max_num_batched_tokens), which bounds TPOT when the inflow
reaches the worker's capacity (inflow >= 1: prefill never drains). Without this a TPOT
prediction is a bare decode step: 16 ms predicted against 200-285 ms measured for a 70B worker
taking twice what it can prefill (`kvplane sim`, synthetic at 2x), until the calibration had
learnt the difference from decodes already under way.

A request prefilled elsewhere comes to its decode worker when its KV is in, and waits for the
step in flight there and then its own step, which computes its prompt's tail: each of those
carries the prefill arriving there with the chance that the worker is prefilling then: the mean
work of the prompts dispatched there, a chunk at most (mean_work; predictor.next_step_with_prefill), for which the arriving rate counts (kvplane/_pricing.c's next_step): the
rate less the work still queued there. The queued work is known and priced as the queue the
request waits out; the rate counts it too, as it was dispatched recently, and counted twice it
made a decode worker that had just taken one long prompt of a burst look busy for the next
one's tail, so every prompt of the burst prefilled there instead of on an idle prefill worker
(`kvplane sim`, Mooncake trace on 8 prefill + 8 decode).

The rate is the work of the requests dispatched there (their prediction's prefill_work_s),
summed with exponential decay over `window_s` and divided by that window: what arrived
recently, as a rate. In the first window after the first dispatch the divisor is the time
elapsed since (at least `window_s` / 4): a cold fleet overloaded from its first second shows it
within half a second, not after the window has filled. It is weighed by (n - 1) / n for the n
requests the fleet was sent in it (decayed as the work is): the first of a stream only marks
when the stream began, and n arrivals evidence n - 1 over the time they span (the rate's
estimate from arrival times). The stream is the fleet's, which routing splits among the workers:
eight requests in the first 0.1 s of a cold fleet are a stream though each worker has seen one
(weighed per worker, a synthetic run at 2x capacity on 8 workers went unprotected in its first
seconds: attainment 85 % against 98 %), while one long prompt on an idle fleet is none
(unweighed, one prompt of 2.3 s of work on an idle CPU worker read as 1.5 s of work per second
and predicted its next request's TPOT at 23 s).
Only this replica's dispatches count: with several replicas each sees its own share (the load
reports and their TPOT calibration carry the rest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvplane.controlplane.core.pool import WorkerTable
from kvplane.types import WorkerId

# Rebase the stored sums when their scale factor would pass this (keeps them finite).
_REBASE_AFTER = 50.0  # windows


@dataclass(frozen=True, slots=True)
class Inflow:
    """The inflow of every row of a table at one moment."""

    rates: np.ndarray  # per row: seconds of prefill work arriving per second
    per_work_s: float  # what one second of work dispatched now counts for in a rate
    # Per row: the mean prefill work of the prompts dispatched there (inf: none), what a step
    # that carries arriving prefill carries at most besides the chunk bound (mean_work).
    carried: np.ndarray | None = None


class PrefillInflow:
    """Per-worker decayed sums of dispatched prefill work, and the decayed number of dispatches
    to the whole fleet; `now`: seconds on one monotonic clock."""

    __slots__ = ("window_s", "_sums", "_squares", "_counts", "_count", "_origin", "_first_at", "_column", "_last_at", "_gaps")

    def __init__(self, window_s: float = 2.0) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s!r}")
        self.window_s = window_s
        # Scaled to `_origin`: the decayed sum at time t is the stored one x exp(-(t - origin) / window).
        self._sums: dict[WorkerId, float] = {}
        self._squares: dict[WorkerId, float] = {}  # each worker's sum of work squared, decayed as its sum
        self._counts: dict[WorkerId, float] = {}  # each worker's dispatches, decayed as its sum
        self._count = 0.0
        # Each worker's last dispatch, and the decayed (number, sum, sum of squares) of the gaps between its dispatches.
        self._last_at: dict[WorkerId, float] = {}
        self._gaps: dict[WorkerId, tuple[float, float, float]] = {}
        self._origin = 0.0
        self._first_at: float | None = None
        # (a table's row_of, its sums, counts and their ratio, Inflow.carried), kept from one view to the next
        self._column: tuple[dict[WorkerId, int], np.ndarray, np.ndarray, np.ndarray] | None = None

    def add(self, worker_id: WorkerId, work_s: float, now: float) -> None:
        """A request whose prefill adds `work_s` of compute was dispatched to `worker_id`."""
        if work_s <= 0:
            return
        if self._first_at is None:
            self._first_at = self._origin = now
        if now - self._origin > _REBASE_AFTER * self.window_s:
            self._rebase(now)
        growth = math.exp((now - self._origin) / self.window_s)
        self._sums[worker_id] = self._sums.get(worker_id, 0.0) + work_s * growth
        self._squares[worker_id] = self._squares.get(worker_id, 0.0) + work_s * work_s * growth
        self._counts[worker_id] = self._counts.get(worker_id, 0.0) + growth
        self._count += growth
        last = self._last_at.get(worker_id)
        self._last_at[worker_id] = now
        # A gap longer than the window is an idle spell, after which a new stream begins: the rate
        # forgets the old one as fast (a single idle minute read as a c_a^2 of 30 for seconds).
        if last is not None and now - last <= self.window_s:
            n, total, squares = self._gaps.get(worker_id, (0.0, 0.0, 0.0))
            gap = now - last
            self._gaps[worker_id] = (n + growth, total + gap * growth, squares + gap * gap * growth)
        if self._column is not None:
            row = self._column[0].get(worker_id)
            if row is None:
                self._column = None
            else:
                _, sums, counts, carried = self._column
                sums[row] += work_s * growth
                counts[row] += growth
                carried[row] = sums[row] / counts[row]

    def forget(self, worker_id: WorkerId) -> None:
        self._counts.pop(worker_id, None)
        self._squares.pop(worker_id, None)
        self._last_at.pop(worker_id, None)
        self._gaps.pop(worker_id, None)
        if self._sums.pop(worker_id, None) is not None:
            self._column = None

    def rate(self, worker_id: WorkerId, now: float) -> float:
        """Seconds of prefill work arriving at `worker_id` per second."""
        return self._sums.get(worker_id, 0.0) * self._decay(now) * self.per_work_s(now)

    def mean_work(self, worker_id: WorkerId) -> float:
        """The mean prefill work of the prompts recently dispatched to `worker_id` (weighed as its
        rate; inf: none): a step that carries the prefill arriving there carries that much, a
        chunk at most. Priced as a full chunk, the first remote requests' TTFT was predicted 95 ms
        over what they measured on workers taking prompts of a few hundred tokens (`kvplane sim
        --decisions`, 128-512-token prompts on 4 prefill + 4 decode workers)."""
        count = self._counts.get(worker_id, 0.0)
        return self._sums[worker_id] / count if count > 0 else math.inf

    def spread_work(self, worker_id: WorkerId) -> float:
        """E[w] x (c_w^2 + c_a^2) over the prompts recently dispatched to `worker_id` (0: none), w
        each one's work, c_w^2 its squared coefficient of variation and c_a^2 that of the gaps
        between their arrivals there: the prefill arriving in a window of D seconds is a sum of
        a random number of prompts, whose variance is inflow x D x this (a renewal stream's
        work; predictor.tpot_spread_seconds). For Poisson arrivals (c_a^2 = 1, also the answer
        before a worker has two gaps) it is E[w^2] / E[w]. Routing to the least loaded and
        admission that holds each worker at its objectives make a worker's arrivals more regular
        than Poisson (`kvplane sim`, synthetic on 8 both with predictive admission: c_a^2 0.32 at
        1x, 0.18 at 2x), a mix of chat and long documents burstier (1.9 at 470 req/s)."""
        total = self._sums.get(worker_id, 0.0)
        if not total > 0:
            return 0.0
        poisson = self._squares[worker_id] / total  # E[w^2] / E[w] = E[w] (1 + c_w^2)
        n, gaps, squares = self._gaps.get(worker_id, (0.0, 0.0, 0.0))
        if n < 2 * self._scale(worker_id) or not gaps > 0:
            return poisson
        arrivals_scv = squares * n / (gaps * gaps) - 1.0
        return max(poisson - (1.0 - arrivals_scv) * total / self._counts[worker_id], 0.0)

    def _scale(self, worker_id: WorkerId) -> float:
        """The stored weight of one dispatch made at the worker's last dispatch (the sums' scale then)."""
        return math.exp((self._last_at[worker_id] - self._origin) / self.window_s)

    def view(self, table: WorkerTable, now: float) -> Inflow:
        """Every row of `table` (tables of one set of workers share their rows)."""
        if self._column is None or self._column[0] is not table.row_of:
            sums, counts = np.zeros(len(table.views)), np.zeros(len(table.views))
            carried = np.full(len(table.views), np.inf)
            for worker_id, total in self._sums.items():
                row = table.row_of.get(worker_id)
                if row is not None:
                    sums[row], counts[row] = total, self._counts[worker_id]
                    carried[row] = total / counts[row]
            self._column = (table.row_of, sums, counts, carried)
        _, sums, _, carried = self._column
        per_work = self.per_work_s(now)
        return Inflow(sums * (self._decay(now) * per_work), per_work, carried)

    def _decay(self, now: float) -> float:
        return math.exp(-(now - self._origin) / self.window_s)

    def per_work_s(self, now: float) -> float:
        """What one second of work dispatched now counts for in a rate: 1 / the divisor, times
        (n - 1) / n for the n requests (decayed) the fleet was sent (module docstring)."""
        if self._first_at is None:
            return 0.0
        n = self._count * self._decay(now)
        return max(n - 1.0, 0.0) / n / self._divisor(now) if n > 0 else 0.0

    def _divisor(self, now: float) -> float:
        """The window, or the time since the first dispatch while shorter (at least a quarter
        window): E[decayed sum] = rate x window x (1 - exp(-elapsed / window))."""
        assert self._first_at is not None
        w = self.window_s
        return w * -math.expm1(-max(now - self._first_at, w / 4) / w)

    def _rebase(self, now: float) -> None:
        factor = self._decay(now)
        self._sums = {w: total * factor for w, total in self._sums.items() if total * factor > 1e-12}
        self._counts = {w: self._counts[w] * factor for w in self._sums}
        self._squares = {w: self._squares[w] * factor for w in self._sums}
        self._gaps = {w: (n * factor, total * factor, squares * factor) for w, (n, total, squares) in self._gaps.items() if w in self._sums}
        self._last_at = {w: at for w, at in self._last_at.items() if w in self._sums}
        self._count *= factor
        self._origin = now
        self._column = None
