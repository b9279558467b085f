"""Load accounting: a routed request counts once, whether or not a report shows it yet, and its
load leaves its worker when its prefill ends and when it finishes, not at the next report.
Fleet defaults (conftest): 100-block workers. Times are seconds on the ledger's clock."""

from __future__ import annotations

import dataclasses
import random

import pytest

from kvplane.controlplane.core.accounting import Charge, LoadLedger, Phase
from kvplane.controlplane.core.index import CacheIndex
from kvplane.controlplane.core.pool import WorkerTable, cluster_with, table_of
from kvplane.controlplane.core.views import ClusterView
from kvplane.types import WorkerId

W = WorkerId("w")
P = WorkerId("p")
# Decodes on w: 30 prompt tokens to compute, 14 blocks held (8 of them new: 6 were cached).
DECODE = Charge(W, prefill_tokens=30, num_blocks=14, num_new_blocks=8, decodes=True)


def load_of(view) -> tuple[int, int, int, int, int]:
    """(running, waiting, queued prefill tokens, used blocks, pending blocks)."""
    load = view.load
    return load.num_running, load.num_waiting, load.num_queued_prefill_tokens, load.num_used_blocks, view.pending_blocks


def test_a_routed_request_counts_before_any_report_and_only_once_after(worker_view):
    ledger = LoadLedger(report_lag_s=0.1)
    ledger.dispatched(1, [DECODE], now=0.0)
    # No report shows it: it waits with its tokens; its new blocks are pending, not used.
    assert load_of(ledger.adjust(worker_view("w"))) == (0, 1, 30, 0, 8)
    ledger.reported(W, now=0.05)
    # The report shows it queued (and its 14 blocks, cached prefix included): nothing is added.
    queued = worker_view("w", num_waiting=1, num_queued_prefill_tokens=30, num_used_blocks=14)
    assert load_of(ledger.adjust(queued)) == (0, 1, 30, 14, 0)


def test_prefill_end_and_finish_release_at_once_without_a_report(worker_view):
    ledger = LoadLedger(report_lag_s=0.1)
    ledger.dispatched(1, [DECODE], now=0.0)
    ledger.reported(W, now=0.05)
    stale = worker_view("w", num_waiting=1, num_queued_prefill_tokens=30, num_used_blocks=14)
    ledger.prefill_ended(1, now=0.2)
    # Its tokens leave the queue; whether the engine counts it waiting or running is the report's call.
    assert load_of(ledger.adjust(stale)) == (0, 1, 0, 14, 0)
    ledger.finished(1, now=0.3)
    # Finished: the report taken while it was queued no longer charges anything for it.
    assert load_of(ledger.adjust(stale)) == (0, 0, 0, 0, 0)
    assert ledger.adjust(stale).load.num_free_blocks == 100


def test_a_reports_sample_time_decides_whether_it_shows_a_finish(worker_view):
    ledger = LoadLedger(report_lag_s=0.1)
    ledger.dispatched(1, [DECODE], now=0.0)
    ledger.prefill_ended(1, now=0.2)
    ledger.reported(W, now=0.4, sampled_at=0.3)
    running = worker_view("w", num_running=1, num_used_blocks=14)
    ledger.finished(1, now=1.0)
    # Arrived 0.5 s after the finish (a slow store), but sampled before it: it still shows the
    # request, which stays released.
    ledger.reported(W, now=1.5, sampled_at=0.95)
    assert load_of(ledger.adjust(running)) == (0, 0, 0, 0, 0)
    assert ledger.num_entries(W) == 1
    # Arrived 10 ms after the finish, but sampled after it: it shows the finish; the entry goes,
    # so the report's own numbers stand and nothing is released twice.
    ledger.reported(W, now=1.51, sampled_at=1.01)
    assert ledger.num_entries(W) == 0
    assert load_of(ledger.adjust(worker_view("w", num_running=1, num_used_blocks=14))) == (1, 0, 0, 14, 0)


def test_a_report_arriving_within_the_lag_of_a_finish_is_taken_as_older(worker_view):
    ledger = LoadLedger(report_lag_s=0.1)
    ledger.dispatched(1, [DECODE], now=0.0)
    ledger.prefill_ended(1, now=0.2)
    ledger.reported(W, now=0.4)  # shows it running
    running = worker_view("w", num_running=1, num_used_blocks=14)
    assert load_of(ledger.adjust(running)) == (1, 0, 0, 14, 0)
    ledger.finished(1, now=1.0)
    ledger.reported(W, now=1.05)  # 50 ms after the finish: may have been sampled before it
    assert load_of(ledger.adjust(running)) == (0, 0, 0, 0, 0)
    assert ledger.num_entries(W) == 1
    ledger.reported(W, now=1.2)  # 200 ms after: it shows the finish; the entry goes
    assert ledger.num_entries(W) == 0
    assert load_of(ledger.adjust(worker_view("w"))) == (0, 0, 0, 0, 0)


def test_a_report_within_the_lag_of_a_first_token_does_not_count_the_request_twice(worker_view):
    ledger = LoadLedger(report_lag_s=0.1)
    for dispatch_id in (1, 2):  # two requests start together
        ledger.dispatched(dispatch_id, [DECODE], now=0.0)
        ledger.prefill_ended(dispatch_id, now=0.2)
    ledger.reported(W, now=0.25)  # sampled after both first tokens after all: both running
    both_running = worker_view("w", num_running=2, num_used_blocks=28)
    assert load_of(ledger.adjust(both_running)) == (2, 0, 0, 28, 0)


def test_a_request_finished_before_any_report_leaves_nothing_behind(worker_view):
    ledger = LoadLedger()
    ledger.dispatched(1, [DECODE], now=0.0)
    ledger.prefill_ended(1, now=0.1)
    assert load_of(ledger.adjust(worker_view("w"))) == (1, 0, 0, 0, 8)
    ledger.finished(1, now=0.2)
    ledger.finished(1, now=0.3)  # idempotent
    assert ledger.num_entries(W) == 0


def test_own_requests_in_prefill_are_a_floor_under_a_report_that_predates_them(worker_view):
    ledger = LoadLedger()
    ledger.dispatched(1, [DECODE], now=0.0)
    ledger.reported(W, now=0.01)  # arrived after the dispatch but sampled before the engine had it
    assert load_of(ledger.adjust(worker_view("w"))) == (0, 1, 30, 0, 0)


def test_a_disaggregated_request_charges_its_prefill_worker_only_until_prefill_ends(worker_view):
    ledger = LoadLedger()
    remote = Charge(W, prefill_tokens=0, num_blocks=14, num_new_blocks=14, decodes=True, imported=True)
    prefill = Charge(P, prefill_tokens=56, num_blocks=0, num_new_blocks=0, decodes=False)
    ledger.dispatched(7, [remote, prefill], now=0.0)
    assert load_of(ledger.adjust(worker_view("p"))) == (0, 1, 56, 0, 0)
    assert load_of(ledger.adjust(worker_view("w"))) == (0, 1, 0, 0, 14)
    ledger.reported(P, now=0.1)
    ledger.reported(W, now=0.1)  # the decode worker does not have it yet: its blocks stay promised
    assert load_of(ledger.adjust(worker_view("w"))) == (0, 1, 0, 0, 14)
    ledger.prefill_ended(7, now=0.5)
    assert load_of(ledger.adjust(worker_view("p", num_waiting=1, num_queued_prefill_tokens=56))) == (0, 0, 0, 0, 0)
    # First token out: its KV was pulled in, and the next report shows its blocks as used.
    assert load_of(ledger.adjust(worker_view("w"))) == (0, 1, 0, 0, 0)
    ledger.reported(W, now=0.7)
    assert load_of(ledger.adjust(worker_view("w", num_running=1, num_used_blocks=14))) == (1, 0, 0, 14, 0)


def test_a_remote_prefills_end_releases_its_prefill_worker_before_the_first_token(worker_view):
    ledger = LoadLedger()
    remote = Charge(W, prefill_tokens=0, num_blocks=14, num_new_blocks=14, decodes=True, imported=True)
    prefill = Charge(P, prefill_tokens=56, num_blocks=0, num_new_blocks=0, decodes=False)
    ledger.dispatched(7, [remote, prefill], now=0.0)
    ledger.reported(P, now=0.1)
    ledger.reported(W, now=0.1)
    # The prefill worker has computed it; the KV is being pulled into the decode worker, which may
    # wait for blocks and queue it: the prefill worker's report shows the prompt gone, and this
    # replica's own count no longer holds it there as a floor.
    ledger.remote_prefill_ended(7, now=0.5)
    assert load_of(ledger.adjust(worker_view("p"))) == (0, 0, 0, 0, 0)
    # The decode worker still waits for it: its blocks stay promised until the first token.
    assert load_of(ledger.adjust(worker_view("w"))) == (0, 1, 0, 0, 14)
    ledger.prefill_ended(7, now=0.9)
    assert load_of(ledger.adjust(worker_view("w"))) == (0, 1, 0, 0, 0)
    assert load_of(ledger.adjust(worker_view("p"))) == (0, 0, 0, 0, 0)


def test_a_remote_prefills_end_changes_nothing_for_a_request_prefilled_where_it_decodes(worker_view):
    ledger = LoadLedger()
    ledger.dispatched(1, [DECODE], now=0.0)
    ledger.remote_prefill_ended(1, now=0.1)
    assert load_of(ledger.adjust(worker_view("w"))) == (0, 1, 30, 0, 8)


def test_two_requests_on_one_worker_are_released_separately(worker_view):
    ledger = LoadLedger()
    ledger.dispatched(1, [DECODE], now=0.0)
    ledger.dispatched(2, [DECODE], now=0.0)
    ledger.reported(W, now=0.1)
    ledger.prefill_ended(1, now=0.2)
    ledger.prefill_ended(2, now=0.2)
    ledger.reported(W, now=0.5)
    both = worker_view("w", num_running=2, num_used_blocks=28)
    ledger.finished(1, now=0.6)
    # Its 8 new blocks go; the 6 cached ones it reused may be request 2's too: they stay.
    assert load_of(ledger.adjust(both)) == (1, 0, 0, 20, 0)
    with pytest.raises(ValueError, match="dispatch 2 is already in the ledger"):
        ledger.dispatched(2, [DECODE], now=0.7)


def test_a_shared_cached_prefix_stays_used_until_its_last_reader_finishes(worker_view):
    ledger = LoadLedger()
    for dispatch_id in (1, 2, 3):  # three readers of one 6-block cached prefix, 8 new blocks each
        ledger.dispatched(dispatch_id, [DECODE], now=0.0)
        ledger.prefill_ended(dispatch_id, now=0.2)
    ledger.reported(W, now=0.5)
    three = worker_view("w", num_running=3, num_used_blocks=6 + 3 * 8)
    ledger.finished(1, now=0.6)
    ledger.finished(2, now=0.6)
    # Releasing each in full (14) would show the prefix's holder as empty while request 3 runs.
    assert load_of(ledger.adjust(three)) == (1, 0, 0, 6 + 8, 0)
    ledger.finished(3, now=0.7)
    assert load_of(ledger.adjust(three)) == (0, 0, 0, 0, 0)


def test_a_removed_worker_is_forgotten(worker_view):
    ledger = LoadLedger()
    ledger.dispatched(1, [DECODE], now=0.0)
    ledger.forget_worker(W)
    assert ledger.num_entries(W) == 0
    assert ledger.adjust(worker_view("w")) == worker_view("w")
    ledger.finished(1, now=1.0)  # a late finish of a forgotten request is harmless


def test_a_stale_report_decays_and_own_live_requests_stay_counted(worker_view):
    """Reports stopped at t=10 (a store outage): what they said fades, halving every
    stale_half_life_s after stale_report_s, while this replica's live request stays counted."""
    ledger = LoadLedger(report_lag_s=0.1, stale_report_s=1.0, stale_half_life_s=1.0)
    busy = worker_view("w", num_running=8, num_waiting=4, num_queued_prefill_tokens=400, num_used_blocks=40, reported_at=10.0)
    assert load_of(ledger.adjust(busy, now=10.5)) == (8, 4, 400, 40, 0)  # fresh
    assert load_of(ledger.adjust(busy, now=12.0)) == (4, 2, 200, 20, 0)  # one half-life past stale
    idle = ledger.adjust(busy, now=30.0)
    assert load_of(idle) == (0, 0, 0, 0, 0) and idle.load.num_free_blocks == 100
    ledger.dispatched(1, [DECODE], now=29.0)
    assert load_of(ledger.adjust(busy, now=30.0)) == (0, 1, 30, 0, 8)  # a floor: it runs there
    # No report time known: nothing decays.
    assert load_of(ledger.adjust(worker_view("w", num_running=8), now=30.0))[0] == 8


def test_decay_settings_are_checked():
    with pytest.raises(ValueError, match="stale_half_life_s > 0"):
        LoadLedger(stale_half_life_s=0.0)


def test_corrected_tables_kept_across_calls_equal_corrections_made_from_scratch(worker_view):
    """LoadLedger.corrected redoes only what changed (rows the new view replaced, workers whose
    entries changed, stale rows): after any sequence of dispatches, phase changes, reports and
    new views, its table is the one a fresh correction of every row gives."""
    rng = random.Random(7)
    ids = [f"w{i}" for i in range(12)]

    def view(w: str, now: float):
        return dataclasses.replace(
            worker_view(w, num_running=rng.randrange(4), num_waiting=rng.randrange(3), num_queued_prefill_tokens=rng.randrange(200),
                        num_used_blocks=rng.randrange(50)),
            reported_at=now - rng.choice([0.0, 0.5, 2.0]),
        )  # fmt: skip

    ledger = LoadLedger(report_lag_s=0.1, stale_report_s=1.0, stale_half_life_s=1.0)
    now = 10.0
    cluster = ClusterView(tuple(view(w, now) for w in ids), CacheIndex())
    live: list[int] = []
    for step in range(300):
        now += 0.05
        action = rng.random()
        if action < 0.3:
            d = step + 1
            workers = rng.sample(ids, rng.choice([1, 2]))
            imported = len(workers) == 2  # prefilled on the second worker, pulled into the first
            charges = [
                Charge(w, rng.randrange(100), 5, rng.randrange(6), decodes=i == 0, imported=imported and i == 0)
                for i, w in enumerate(workers)
            ]
            ledger.dispatched(d, charges, now)
            live.append(d)
        elif action < 0.45 and live:
            ledger.prefill_ended(rng.choice(live), now)
        elif action < 0.6 and live:
            ledger.finished(live.pop(rng.randrange(len(live))), now)
        elif action < 0.8:
            changed = {w: view(w, now) for w in rng.sample(ids, rng.randrange(1, 4))}
            for w in changed:
                ledger.reported(w, now, sampled_at=now - rng.choice([0.0, 0.2]))
            cluster = cluster_with(cluster, changed, None)
        table = table_of(cluster)
        for v in table.views:  # the sums kept as entries change = a loop over the entries now
            assert ledger.adjust(v) == _adjusted_by_a_loop(ledger, v), f"step {step}: {v.worker_id}"
        got = ledger.corrected(table, now)
        want = WorkerTable([ledger.adjust(v, now) for v in table.views])
        assert list(got.views) == list(want.views), f"step {step}"
        for column in ("queued", "used", "total", "requests", "pending", "active", "reported_at"):
            assert list(getattr(got, column)) == list(getattr(want, column)), f"step {step}: {column}"


def _adjusted_by_a_loop(ledger: LoadLedger, view):
    """The correction rule (accounting's module docstring) applied by looping over the worker's
    entries: what the ledger's running sums must equal."""
    entries = ledger._worker_to_entries.get(view.worker_id)
    if not entries:
        return view
    load = view.load
    running, waiting, tokens, used, pending = load.num_running, load.num_waiting, load.num_queued_prefill_tokens, load.num_used_blocks, 0
    gone_from_waiting = gone_from_running = floor_tokens = floor_requests = gone_reused_blocks = 0
    for e in entries.values():
        c = e.charge
        here = e.phase is Phase.PREFILL or (e.phase is Phase.DECODE and c.decodes)
        if e.phase is Phase.PREFILL:
            floor_tokens += c.prefill_tokens
        floor_requests += here
        if e.shown is None:
            if e.phase is Phase.PREFILL:
                waiting += 1
                tokens += c.prefill_tokens
            elif here:
                running += 1
            pending += c.num_new_blocks if here and c.decodes else 0
            continue
        if c.imported and e.phase is Phase.PREFILL:
            pending += c.num_new_blocks  # pulled in at its first token: no report shows it before
        if e.shown is Phase.PREFILL and e.phase is not Phase.PREFILL:
            tokens -= c.prefill_tokens
        if (e.shown is Phase.PREFILL or c.decodes) and not here:
            if e.shown is Phase.PREFILL:
                gone_from_waiting += 1
            else:
                gone_from_running += 1
            if c.decodes:
                used -= c.num_new_blocks
                gone_reused_blocks = max(gone_reused_blocks, c.num_blocks - c.num_new_blocks)
    if floor_requests == 0:
        used -= gone_reused_blocks
    gone = min(gone_from_running, running)
    running, waiting = running - gone, max(waiting - (gone_from_running - gone), 0)
    gone = min(gone_from_waiting, waiting)
    waiting, running = waiting - gone, max(running - (gone_from_waiting - gone), 0)
    waiting = max(waiting, floor_requests - running)
    used = min(max(used, 0), max(load.num_total_blocks, load.num_used_blocks))
    adjusted = dataclasses.replace(
        load, num_running=running, num_waiting=waiting, num_queued_prefill_tokens=max(tokens, floor_tokens, 0), num_used_blocks=used,
        num_free_blocks=max(load.num_free_blocks + load.num_used_blocks - used, 0),
    )  # fmt: skip
    return dataclasses.replace(view, load=adjusted, pending_blocks=view.pending_blocks + pending)


def test_a_released_prefix_is_forgotten_once_a_report_shows_its_request_done(worker_view):
    ledger = LoadLedger(report_lag_s=0.1)
    view = worker_view("w", num_waiting=2, num_used_blocks=50)
    ledger.dispatched(1, [Charge(WorkerId("w"), 0, num_blocks=10, num_new_blocks=2, decodes=True)], 1.0)  # reused 8 blocks
    ledger.dispatched(2, [Charge(WorkerId("w"), 0, num_blocks=10, num_new_blocks=9, decodes=True)], 1.0)  # reused 1
    ledger.reported(WorkerId("w"), 2.0, sampled_at=2.0)  # both shown waiting
    ledger.finished(1, 3.0)
    assert ledger.adjust(view).load.num_used_blocks == 50 - 2  # its prefix may be shared with request 2, still here
    ledger.reported(WorkerId("w"), 4.0, sampled_at=4.0)  # request 1 shown done: out of the ledger
    ledger.finished(2, 5.0)
    # Request 2 is gone: its new blocks, and its reused prefix (the last one of ours out) leave.
    assert ledger.adjust(view).load.num_used_blocks == 50 - 9 - 1


def test_a_worker_charged_twice_by_one_dispatch_keeps_the_last_charge_only(worker_view):
    ledger = LoadLedger()
    view = worker_view("w", num_used_blocks=10)
    ledger.dispatched(1, [Charge(WorkerId("w"), 100, 4, 4, decodes=True), Charge(WorkerId("w"), 30, 0, 0, decodes=False)], 1.0)
    assert ledger.adjust(view) == _adjusted_by_a_loop(ledger, view)
    assert ledger.adjust(view).load.num_queued_prefill_tokens == 30
    ledger.finished(1, 2.0)
    assert ledger.adjust(view) == view and ledger.num_entries(WorkerId("w")) == 0
