"""Load accounting: what this replica routed, counted once, from dispatch until it ends.

A worker's load report is a snapshot of its engine. It misses the requests this replica sent
since, and still shows the requests that have since finished their prefill or finished. The
ledger keeps one entry per dispatched request and worker (a Charge), with the phase the request
is in (PREFILL until its first token, then DECODE, then DONE) and the phase the worker's latest
report saw it in, and corrects the report:

- not yet in any report: the request adds 1 waiting (in prefill) or 1 running (decoding), its
  prefill tokens while in prefill, and its new KV blocks to `pending_blocks`, not to used
  blocks (the cost); a request prefilled on another worker keeps its blocks pending on its
  decode worker until its first token: the engine sees it only once its KV is pulled in;
- shown by a report: the report's numbers stand, less what has ended since: its prefill tokens
  once its prefill ended (on a prefill worker, when the decode agent says so,
  `remote_prefill_ended`, not at the first token, which comes after the pull and the decode
  worker's queue); the request itself (from waiting if the report saw it in prefill, else from
  running; the engine, not the ledger, decides which it counted) and its KV blocks once it
  finished, or, on a prefill worker, once its prefill ended.

So a request's queued prefill tokens leave its worker the moment its prefill ends and everything
else the moment it finishes, not when a report happens to arrive: the next request of an agent
loop finds the prefix holder as idle as it is. When a report arrives, every entry of that worker
counts as shown in its current phase (a finished entry is dropped): each request is counted once.

Reports lag: they travel through the store. A report says when the worker sampled it, and one
sampled before an entry's prefill ended or it finished shows the entry's previous phase (the
release stands); a report with no sample time that arrives less than `report_lag_s` after the
change is taken to predate it. Conversely a report that arrives right after a dispatch may predate the
request: this replica's requests still in prefill are a floor under the queued prefill tokens,
and its live requests a floor under running + waiting. Signals never go below zero.

What a report shows of one request is an estimate (the engine reports totals): a finished
request releases its new blocks at once, and the cached prefix it reused only once none of this
replica's requests is left on the worker (they may share it: a hot prefix stays in use while its
readers run); `running_remaining_tokens` keeps a finished request until the next report. Both errors last at most one report interval.
Reports stop (the agent died or hangs, the store is down): a report older than `stale_report_s`
stops standing and its counts decay, halving every `stale_half_life_s`, while this replica's own
live requests stay counted (they are a floor). Without that, a store outage freezes whatever
the last reports said, and admission keeps rejecting for a cluster that has long gone idle.
The sample time is the worker's wall clock: a skew between its clock and ours misjudges changes
within the skew of a sample. Without one, the lag is a guess: a report slower than report_lag_s
still shows a finished request for one interval, and a change within report_lag_s before a fast
report is released twice until the next report.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvplane.controlplane.core.pool import WorkerTable
from kvplane.controlplane.core.views import WorkerLoadView, WorkerView
from kvplane.types import WorkerId


class Phase(enum.IntEnum):
    PREFILL = 0  # dispatched, no first token yet
    DECODE = 1  # first token out
    DONE = 2  # finished, failed or cancelled


@dataclass(frozen=True, slots=True)
class Charge:
    """The load one request puts on one worker."""

    worker_id: WorkerId
    prefill_tokens: int  # prompt tokens it computes there
    num_blocks: int  # KV blocks it holds there while it runs (prompt + max_tokens)
    num_new_blocks: int  # of those, the blocks no cached or fetched prefix provides
    decodes: bool  # it decodes there (False: a prefill worker's share)
    imported: bool = False  # its KV is prefilled elsewhere and pulled in: the worker sees it only then


@dataclass(slots=True)
class _Entry:
    charge: Charge
    phase: Phase = Phase.PREFILL
    previous: Phase = Phase.PREFILL  # the phase before `phase`
    since: float = 0.0  # when `phase` began
    shown: Phase | None = None  # the phase the latest report saw (None: no report yet)


# What one entry adds to its worker's corrections (`_contribution`), in this order.
_FLOOR_TOKENS, _FLOOR_REQUESTS, _NEW_WAITING, _NEW_TOKENS, _NEW_RUNNING, _NEW_PENDING = range(6)
_ENDED_TOKENS, _GONE_WAITING, _GONE_RUNNING, _GONE_BLOCKS = range(6, 10)


def _contribution(e: _Entry) -> tuple[tuple[int, ...], int | None]:
    """(what the entry adds to each of its worker's sums, the cached prefix it released or None):
    the rule of the module docstring for one request."""
    c = e.charge
    in_prefill = e.phase is Phase.PREFILL
    here = in_prefill or (e.phase is Phase.DECODE and c.decodes)
    floor_tokens = c.prefill_tokens if in_prefill else 0
    if e.shown is None:  # no report shows it yet: it adds itself
        new_pending = c.num_new_blocks if here and c.decodes else 0
        return (floor_tokens, int(here), int(in_prefill), floor_tokens, int(here and not in_prefill), new_pending, 0, 0, 0, 0), None
    # Shown by a report: what ended since leaves. A pull's blocks are not in the report until the
    # pull: they stay pending until the first token.
    ended_tokens = c.prefill_tokens if e.shown is Phase.PREFILL and not in_prefill else 0
    gone = (e.shown is Phase.PREFILL or c.decodes) and not here
    gone_waiting = int(gone and e.shown is Phase.PREFILL)
    released = gone and c.decodes
    pulling = c.num_new_blocks if c.imported and in_prefill else 0
    return (
        (
            floor_tokens,
            int(here),
            0,
            0,
            0,
            pulling,
            ended_tokens,
            gone_waiting,
            int(gone) - gone_waiting,
            c.num_new_blocks if released else 0,
        ),
        c.num_blocks - c.num_new_blocks if released else None,
    )


class _Totals:
    """The sums `adjust` needs over one worker's entries, kept as the entries change: a
    correction costs the same whatever the number of requests routed there since its last
    report (a hot prefix's holder has hundreds at 1,000 requests/s)."""

    __slots__ = ("sums", "reused")

    def __init__(self) -> None:
        self.sums = [0] * 10
        self.reused: collections.Counter[int] = collections.Counter()  # cached prefixes of gone requests

    def add(self, e: _Entry, sign: int) -> None:
        contribution, reused = _contribution(e)
        self.sums = [total + sign * part for total, part in zip(self.sums, contribution)]
        if reused is not None:
            self.reused[reused] += sign
            if not self.reused[reused]:
                del self.reused[reused]


class LoadLedger:
    """Per-request load corrections on top of workers' load reports. `now`: seconds on any
    monotonic clock, the same one for every call. Dispatch ids are the caller's (unique)."""

    __slots__ = (
        "report_lag_s", "stale_report_s", "stale_half_life_s", "_worker_to_entries", "_worker_to_totals", "_dispatch_to_workers",
        "_changed_workers", "_corrected",
    )  # fmt: skip

    def __init__(self, report_lag_s: float = 0.1, stale_report_s: float = 1.0, stale_half_life_s: float = 1.0) -> None:
        if report_lag_s < 0 or stale_report_s < 0 or stale_half_life_s <= 0:
            raise ValueError(
                f"report_lag_s and stale_report_s must be >= 0 and stale_half_life_s > 0, got {report_lag_s}, {stale_report_s}, {stale_half_life_s}"
            )
        self.report_lag_s = report_lag_s
        self.stale_report_s = stale_report_s
        self.stale_half_life_s = stale_half_life_s
        self._worker_to_entries: dict[WorkerId, dict[int, _Entry]] = {}
        self._worker_to_totals: dict[WorkerId, _Totals] = {}  # the sums over each worker's entries
        self._dispatch_to_workers: dict[int, list[WorkerId]] = {}
        # Workers whose entries changed since the last corrected(), and what it last returned:
        # (the table it corrected, the corrected table, the rows that were stale then).
        self._changed_workers: set[WorkerId] = set()
        self._corrected: tuple[WorkerTable, WorkerTable, set[int]] | None = None

    # -- what happened ---------------------------------------------------------------------------

    def dispatched(self, dispatch_id: int, charges: Sequence[Charge], now: float) -> None:
        if dispatch_id in self._dispatch_to_workers:
            raise ValueError(f"dispatch {dispatch_id} is already in the ledger")
        self._dispatch_to_workers[dispatch_id] = [c.worker_id for c in charges]
        for charge in charges:
            entries, totals = self._worker_to_entries.setdefault(charge.worker_id, {}), self._totals(charge.worker_id)
            replaced = entries.get(dispatch_id)  # one worker named twice: the last charge stands
            if replaced is not None:
                totals.add(replaced, -1)
            e = entries[dispatch_id] = _Entry(charge, since=now)
            totals.add(e, +1)
            self._changed(charge.worker_id)

    def prefill_ended(self, dispatch_id: int, now: float) -> None:
        """The request's first token is out: its prefill tokens leave the queues."""
        self._advance(dispatch_id, Phase.DECODE, now)

    def remote_prefill_ended(self, dispatch_id: int, now: float) -> None:
        """Its prefill worker has computed the prompt (the KV is being pulled): that worker's
        share ends; its decode worker's waits for the first token."""
        self._advance(dispatch_id, Phase.DECODE, now, prefill_workers_only=True)

    def finished(self, dispatch_id: int, now: float) -> None:
        """The request ended (completed, failed or cancelled): it leaves its workers. Idempotent."""
        self._advance(dispatch_id, Phase.DONE, now)

    def reported(self, worker_id: WorkerId, now: float, sampled_at: float | None = None) -> None:
        """A load report from `worker_id` arrived at `now`, taken at `sampled_at` (None: unknown):
        it shows every entry there as it was when sampled; without a sample time, a change less
        than report_lag_s old is taken to postdate it."""
        entries = self._worker_to_entries.get(worker_id)
        if not entries:
            return
        self._changed(worker_id)
        for dispatch_id, e in list(entries.items()):
            if sampled_at is not None:
                recent = e.phase is not Phase.PREFILL and e.since > sampled_at
            else:
                recent = e.phase is not Phase.PREFILL and now - e.since < self.report_lag_s
            shown = e.previous if recent else e.phase
            if e.shown is None or shown > e.shown:
                totals = self._worker_to_totals[worker_id]
                totals.add(e, -1)
                e.shown = shown
                totals.add(e, +1)
            if e.shown is Phase.DONE:
                self._drop(worker_id, dispatch_id)

    def forget_worker(self, worker_id: WorkerId) -> None:
        for dispatch_id in list(self._worker_to_entries.get(worker_id, {})):
            self._drop(worker_id, dispatch_id)
        self._changed_workers.add(worker_id)

    # -- the corrected view ------------------------------------------------------------------------

    def decay(self, view: WorkerView, now: float) -> float:
        """How much of `view`'s reported load still stands at `now`: 1 while the report is fresh,
        then halving every stale_half_life_s (reports stopped: what they said is over by now)."""
        if view.reported_at is None:
            return 1.0
        age = now - view.reported_at - self.stale_report_s
        return 1.0 if age <= 0 else 0.5 ** (age / self.stale_half_life_s)

    def adjust(self, view: WorkerView, now: float | None = None) -> WorkerView:
        """`view` with its reported load decayed (if stale at `now`) and corrected for this
        replica's requests."""
        if now is not None:
            factor = self.decay(view, now)
            if factor < 1.0:
                view = dataclasses.replace(view, load=_scaled(view.load, factor))
        totals = self._worker_to_totals.get(view.worker_id)
        if totals is None:
            return view
        load, sums = view.load, totals.sums
        running = load.num_running + sums[_NEW_RUNNING]
        waiting = load.num_waiting + sums[_NEW_WAITING]
        tokens = load.num_queued_prefill_tokens + sums[_NEW_TOKENS] - sums[_ENDED_TOKENS]
        used = load.num_used_blocks - sums[_GONE_BLOCKS]
        pending = sums[_NEW_PENDING]
        floor_tokens, floor_requests = sums[_FLOOR_TOKENS], sums[_FLOOR_REQUESTS]
        gone_from_waiting, gone_from_running = sums[_GONE_WAITING], sums[_GONE_RUNNING]
        gone_reused_blocks = max(totals.reused, default=0)  # the largest cached prefix a gone request shared (see below)
        # A gone request's cached prefix stays in use while requests of ours that may share it
        # run here (a hot prefix); only the last one out releases it (an agent loop's holder).
        if floor_requests == 0:
            used -= gone_reused_blocks
        running, waiting = _take(running, waiting, gone_from_running)
        waiting, running = _take(waiting, running, gone_from_waiting)
        waiting = max(waiting, floor_requests - running)
        used = min(max(used, 0), max(load.num_total_blocks, load.num_used_blocks))
        adjusted = dataclasses.replace(
            load,
            num_running=running,
            num_waiting=waiting,
            num_queued_prefill_tokens=max(tokens, floor_tokens, 0),
            num_used_blocks=used,
            num_free_blocks=max(load.num_free_blocks + load.num_used_blocks - used, 0),
        )
        return dataclasses.replace(view, load=adjusted, pending_blocks=view.pending_blocks + pending)

    def corrected(self, table: WorkerTable, now: float) -> WorkerTable:
        """`table` with `adjust` applied at `now` to the rows it changes (the workers this ledger
        has entries for, and those whose report is stale). Kept from one call to the next: when
        `table` was made from the previous call's by `WorkerTable.replaced` (the control plane's
        view after new reports), only its changed rows, the workers whose entries changed since
        and the stale rows are redone, in place in the table the previous call returned (this
        ledger's alone: WorkerTable.private), so a request pays for what changed, not for every
        worker with requests in flight nor for a copy of the fleet's columns. A table returned
        here is valid until the next call."""
        stale = set(np.flatnonzero(now - table.reported_at - self.stale_report_s > 0).tolist())  # NaN (no time): never stale
        changed_workers, self._changed_workers = self._changed_workers, set()
        last = self._corrected
        if last is not None and last[0] is table:
            base_rows: frozenset[int] = frozenset()
        elif last is not None and table.parent is last[0]:
            base_rows = table.changed_rows
        else:  # another table: correct it from scratch
            rows = {table.row_of[w] for w in self._worker_to_entries if w in table.row_of} | stale
            corrected = table.private().updated(self._adjusted_rows(table, rows, now))
            self._corrected = (table, corrected, stale)
            return corrected
        row_of = table.row_of
        # Rows stale last time are redone too: in case a report that is no longer stale came without a new row.
        redo = set(base_rows) | stale | last[2] | {row_of[w] for w in changed_workers if w in row_of}
        views = self._adjusted_rows(table, redo, now)
        views.update({row: table.views[row] for row in redo if row not in views})  # back to the report as it is
        corrected = last[1].updated(views)  # in place: the previous call's table is this ledger's alone
        self._corrected = (table, corrected, stale)
        return corrected

    def _adjusted_rows(self, table: WorkerTable, rows: set[int], now: float) -> dict[int, WorkerView]:
        """row -> the adjusted view, for those of `rows` that `adjust` changes."""
        out = {}
        for row in rows:
            view = table.views[row]
            adjusted = self.adjust(view, now)
            if adjusted is not view:
                out[row] = adjusted
        return out

    def num_entries(self, worker_id: WorkerId) -> int:
        """Requests the ledger still corrects `worker_id`'s reports for."""
        return len(self._worker_to_entries.get(worker_id, {}))

    # -- internals -------------------------------------------------------------------------------

    def _entry(self, worker_id: WorkerId, dispatch_id: int) -> _Entry | None:
        return self._worker_to_entries.get(worker_id, {}).get(dispatch_id)

    def _advance(self, dispatch_id: int, phase: Phase, now: float, prefill_workers_only: bool = False) -> None:
        for worker_id in list(self._dispatch_to_workers.get(dispatch_id, ())):
            e = self._entry(worker_id, dispatch_id)
            if e is None or e.phase >= phase or (prefill_workers_only and e.charge.decodes):
                continue
            totals = self._worker_to_totals[worker_id]
            totals.add(e, -1)
            e.previous, e.phase, e.since = e.phase, phase, now
            totals.add(e, +1)
            self._changed(worker_id)
            if phase is Phase.DONE and e.shown is None:
                self._drop(worker_id, dispatch_id)  # no report ever showed it: nothing to undo

    def _totals(self, worker_id: WorkerId) -> _Totals:
        totals = self._worker_to_totals.get(worker_id)
        if totals is None:
            totals = self._worker_to_totals[worker_id] = _Totals()
        return totals

    def _changed(self, worker_id: WorkerId) -> None:
        self._changed_workers.add(worker_id)

    def _drop(self, worker_id: WorkerId, dispatch_id: int) -> None:
        entries = self._worker_to_entries.get(worker_id)
        if entries is not None:
            self._changed(worker_id)
            e = entries.pop(dispatch_id, None)
            if e is not None:
                self._worker_to_totals[worker_id].add(e, -1)
            if not entries:
                del self._worker_to_entries[worker_id], self._worker_to_totals[worker_id]
        workers = self._dispatch_to_workers.get(dispatch_id)
        if workers is not None and all(self._entry(w, dispatch_id) is None for w in workers):
            del self._dispatch_to_workers[dispatch_id]


def _scaled(load: WorkerLoadView, factor: float) -> WorkerLoadView:
    """A report's counts times `factor` (rounded down: a decayed report reaches zero)."""
    used = int(load.num_used_blocks * factor)
    return dataclasses.replace(
        load,
        num_running=int(load.num_running * factor),
        num_waiting=int(load.num_waiting * factor),
        num_queued_prefill_tokens=int(load.num_queued_prefill_tokens * factor),
        num_used_blocks=used,
        num_free_blocks=load.num_free_blocks + load.num_used_blocks - used,
        running_remaining_tokens=load.running_remaining_tokens[: int(len(load.running_remaining_tokens) * factor)],
        running_context_tokens=int(load.running_context_tokens * factor),
    )


def _take(first: int, second: int, n: int) -> tuple[int, int]:
    """Removes n from `first`, the rest (if first runs out) from `second`; never below zero."""
    from_first = min(n, first)
    return first - from_first, max(second - (n - from_first), 0)
