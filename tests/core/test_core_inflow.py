"""Prefill inflow (core/inflow.py): the prefill work routed to a worker per second, and what it
does to a decode's predicted time per output token (predictor.shared_step_seconds)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from kvplane.controlplane.core.inflow import PrefillInflow
from kvplane.controlplane.core.pool import WorkerTable
from kvplane.controlplane.core.predictor import TPOT_Z, WorkerPerf, predict, shared_step_seconds, tpot_spread_seconds
from kvplane.latency import StepTimeModel
from kvplane.types import Role, WorkerId
from tests.core.conftest import make_worker_view


def decayed_count(n: int, interval_s: float, window_s: float) -> float:
    """The decayed number of n dispatches `interval_s` apart, at the last one."""
    return sum(math.exp(-k * interval_s / window_s) for k in range(n))


def test_a_steady_stream_reads_as_its_rate_from_the_first_window_on():
    inflow = PrefillInflow(window_s=2.0)
    # 0.1 s of prefill work every 0.05 s: 2 s of work per second.
    for i in range(400):
        inflow.add(WorkerId("a"), 0.1, i * 0.05)
        if i in (20, 399):  # after 1 s (half a window) and after 20 s
            assert inflow.rate(WorkerId("a"), i * 0.05) == pytest.approx(2.0, rel=0.08)
    assert inflow.rate(WorkerId("b"), 20.0) == 0.0


def test_the_rate_decays_once_the_stream_stops():
    inflow = PrefillInflow(window_s=2.0)
    for i in range(400):
        inflow.add(WorkerId("a"), 0.1, i * 0.05)
    at_end = inflow.rate(WorkerId("a"), 19.95)
    # A window later: e^-1 of the work (the warm-up divisor has long reached the window), and the
    # dispatches evidencing it decay too: (n - 1) / n of e^-1 of them.
    n = decayed_count(400, 0.05, 2.0)
    evidence = (n * math.exp(-1) - 1) / (n * math.exp(-1)) / ((n - 1) / n)
    assert inflow.rate(WorkerId("a"), 21.95) == pytest.approx(at_end * math.exp(-1) * evidence, rel=1e-4)
    assert inflow.rate(WorkerId("a"), 20.0 + 2.0 * 60) < 1e-20


def test_one_request_is_no_stream_and_a_second_is_weighed_by_the_evidence():
    """A stream's first request only marks when it began: n requests evidence (n - 1) / n of
    their work's rate. The divisor is at least a quarter window: two requests right after the
    start are their work over half a second, not over the microseconds since."""
    inflow = PrefillInflow(window_s=2.0)
    inflow.add(WorkerId("a"), 2.3, 100.0)  # one long prompt on a slow worker
    assert inflow.rate(WorkerId("a"), 100.001) == 0.0
    inflow.add(WorkerId("a"), 0.2, 100.1)
    decay = math.exp(-0.1 / 2.0)  # the first, 0.1 s before
    n = 1 + decay
    expected = (2.3 * decay + 0.2) / (2.0 * -math.expm1(-0.25)) * (n - 1) / n
    assert inflow.rate(WorkerId("a"), 100.1) == pytest.approx(expected, rel=1e-9)


def test_the_view_is_the_rate_per_table_row_and_follows_new_dispatches():
    inflow = PrefillInflow(window_s=1.0)
    table = WorkerTable([make_worker_view(w, Role.BOTH) for w in ("a", "b", "c")])
    for t in (4.0, 5.0):
        inflow.add(WorkerId("c"), 0.3, t)
        inflow.add(WorkerId("a"), 0.1, t + 0.5)
    column = inflow.view(table, 6.0).rates
    assert column.tolist() == pytest.approx([inflow.rate(WorkerId(w), 6.0) for w in ("a", "b", "c")])
    inflow.add(WorkerId("b"), 0.2, 6.0)  # kept in the cached columns, not rebuilt
    inflow.add(WorkerId("b"), 0.2, 6.5)
    assert inflow.view(table, 7.0).rates[1] == pytest.approx(inflow.rate(WorkerId("b"), 7.0))
    inflow.forget(WorkerId("c"))
    assert inflow.view(table, 7.0).rates[2] == 0.0


def test_a_workers_prompts_carry_their_mean_work_weighed_as_its_rate():
    """What a step carrying the prefill arriving at a worker carries: the mean work of the
    prompts dispatched there, newer ones weighing more (the rate's decay), none: inf."""
    inflow = PrefillInflow(window_s=1.0)
    table = WorkerTable([make_worker_view(w, Role.BOTH) for w in ("a", "b", "c")])
    inflow.add(WorkerId("a"), 0.010, 1.0)
    inflow.add(WorkerId("a"), 0.030, 1.0)
    inflow.add(WorkerId("b"), 0.100, 1.0)
    assert inflow.view(table, 2.0).carried.tolist() == pytest.approx([0.020, 0.100, math.inf])
    inflow.add(WorkerId("b"), 0.200, 1.0 + math.log(3))  # weighs 3x the first: (0.1 + 3 x 0.2) / 4
    assert inflow.mean_work(WorkerId("b")) == pytest.approx(0.175)
    assert inflow.view(table, 3.0).carried[1] == pytest.approx(0.175)
    inflow.forget(WorkerId("a"))
    assert inflow.mean_work(WorkerId("a")) == math.inf and inflow.view(table, 3.0).carried[0] == math.inf


def test_a_workers_prompts_spread_as_their_second_moment_over_their_mean():
    """PrefillInflow.spread_work: E[w^2] / E[w] of the work dispatched to a worker, decayed as its
    rate: the mean when prompts are alike, more when a few long ones carry most of it."""
    inflow = PrefillInflow(window_s=1.0)
    assert inflow.spread_work(WorkerId("a")) == 0.0
    for _ in range(4):
        inflow.add(WorkerId("a"), 0.010, 1.0)
    assert inflow.spread_work(WorkerId("a")) == pytest.approx(0.010)
    inflow.add(WorkerId("b"), 0.010, 1.0)
    inflow.add(WorkerId("b"), 0.090, 1.0)
    assert inflow.spread_work(WorkerId("b")) == pytest.approx((0.010**2 + 0.090**2) / 0.100)
    inflow.add(WorkerId("b"), 0.100, 1.0 + math.log(2))  # weighs 2x the first two
    assert inflow.spread_work(WorkerId("b")) == pytest.approx((0.010**2 + 0.090**2 + 2 * 0.100**2) / 0.300)
    inflow._rebase(5.0)
    assert inflow.spread_work(WorkerId("b")) == pytest.approx((0.010**2 + 0.090**2 + 2 * 0.100**2) / 0.300)
    inflow.forget(WorkerId("b"))
    assert inflow.spread_work(WorkerId("b")) == 0.0


@pytest.mark.parametrize("arrivals_scv", [0.25, 1.0, 4.0])
def test_the_spread_of_a_workers_prompts_counts_how_regularly_they_arrive(arrivals_scv):
    """spread_work = E[w] x (c_w^2 + c_a^2): prompts of 10 ms of work each (c_w^2 = 0) arriving at
    gamma-distributed gaps of mean 20 ms and squared coefficient of variation c_a^2 (1: Poisson,
    E[w^2] / E[w]), estimated from the gaps within 10 %."""
    rng = np.random.default_rng(3)
    inflow, now = PrefillInflow(window_s=10.0), 0.0
    for gap in rng.gamma(1 / arrivals_scv, 0.020 * arrivals_scv, 4000):
        now += gap
        inflow.add(WorkerId("a"), 0.010, now)
    assert inflow.spread_work(WorkerId("a")) == pytest.approx(0.010 * arrivals_scv, rel=0.10)
    inflow.add(WorkerId("b"), 0.010, now)
    inflow.add(WorkerId("b"), 0.030, now + 0.020)  # one gap: no estimate yet, Poisson's E[w^2] / E[w]
    assert inflow.spread_work(WorkerId("b")) == pytest.approx((0.010**2 + 0.030**2 * math.exp(0.002)) / (0.010 + 0.030 * math.exp(0.002)))


def test_an_idle_spell_is_not_a_gap_of_the_stream_after_it():
    """Alike prompts every 100 ms after a minute with none: a regular stream (no spread from
    its arrivals), not one whose single 60 s gap reads as wildly irregular arrivals."""
    inflow = PrefillInflow(window_s=2.0)
    for now in (0.0, 0.1, 0.2):
        inflow.add(WorkerId("a"), 0.010, now)
    for k in range(20):
        inflow.add(WorkerId("a"), 0.010, 60.2 + 0.1 * k)
    assert inflow.spread_work(WorkerId("a")) == pytest.approx(0.0, abs=1e-9)


def _renewal_decodes(intervals: int, own_s: float, rate: float, arrivals_scv: float, work_s: float, trials: int, rng) -> np.ndarray:
    """TPOTs as _busy_decodes, the prompts (`work_s` each) arriving at gamma gaps of mean 1 / rate
    and squared coefficient of variation `arrivals_scv`, the decode starting at a random moment."""
    shape, scale = 1 / arrivals_scv, arrivals_scv / rate
    tpots = np.empty(trials)
    for t in range(trials):
        end, arrival = intervals * own_s, rng.gamma(shape, scale) * rng.random()
        while arrival < end:
            end += work_s
            arrival += rng.gamma(shape, scale)
        tpots[t] = end / intervals
    return tpots


@pytest.mark.parametrize("arrivals_scv", [0.1, 0.25, 4.0])
def test_a_short_decodes_tpot_spread_with_regular_or_bursty_arrivals(arrivals_scv):
    """tpot_spread_seconds with spread_work = E[w] x c_a^2 (alike prompts) against a Monte Carlo
    of a renewal stream of prompts: within 10 % for decodes of 8 and 32 steps."""
    rng = np.random.default_rng(11)
    work_s, inflow, own_s = 0.010, 0.6, 0.020
    for intervals in (8, 32):
        tpots = _renewal_decodes(intervals, own_s, inflow / work_s, arrivals_scv, work_s, 20000, rng)
        mean_s = shared_step_seconds(own_s, inflow, 1.0)
        assert tpots.std() == pytest.approx(tpot_spread_seconds(mean_s, inflow, work_s * arrivals_scv, intervals, 1.0), rel=0.10)


def _busy_decodes(intervals: int, own_s: float, rate: float, work, trials: int, rng: np.random.Generator) -> np.ndarray:
    """TPOTs of `trials` decodes of `intervals` steps needing `own_s` each, on a worker whose
    steps also compute every prompt arriving (Poisson, `rate` a second, `work(k)` seconds each)
    before the decode ends: the busy period its own work starts."""
    tpots = np.empty(trials)
    for t in range(trials):
        end = covered = intervals * own_s
        arrivals = rng.poisson(rate * covered)
        end += work(arrivals).sum()
        while end > covered:
            arrivals = rng.poisson(rate * (end - covered))
            covered = end
            end += work(arrivals).sum()
        tpots[t] = end / intervals
    return tpots


@pytest.mark.parametrize("prompts", ["alike", "exponential"])
def test_a_short_decodes_tpot_spreads_as_the_busy_period_it_is(prompts):
    """predictor.tpot_spread_seconds against a Monte Carlo of the process it models: a decode of
    n steps (20 ms each past the slack) on a worker taking prompts at 0.6 s of work a second;
    its mean TPOT is shared_step_seconds' and its standard deviation the formula's, within 5 %."""
    rng = np.random.default_rng(7)
    mean_work = 0.010
    if prompts == "alike":
        work, spread_work = (lambda k: np.full(k, mean_work)), mean_work
    else:
        work, spread_work = (lambda k: rng.exponential(mean_work, k)), 2 * mean_work  # E[w^2] / E[w]
    inflow, own_s, bound_s = 0.6, 0.020, 1.0
    for intervals in (8, 32):
        tpots = _busy_decodes(intervals, own_s, inflow / mean_work, work, 20000, rng)
        mean_s = shared_step_seconds(own_s, inflow, bound_s)
        assert tpots.mean() == pytest.approx(mean_s, rel=0.02)
        assert tpots.std() == pytest.approx(tpot_spread_seconds(mean_s, inflow, spread_work, intervals, bound_s), rel=0.05)


def test_the_tpot_spread_is_none_without_inflow_and_never_passes_the_chunk_bound():
    assert tpot_spread_seconds(0.050, 0.0, 0.01, 10, 1.0) == 0.0
    assert tpot_spread_seconds(0.050, 0.6, 0.0, 10, 1.0) == 0.0  # nothing dispatched there yet
    assert tpot_spread_seconds(0.050, 0.6, 0.01, 0, 1.0) == 0.0  # one token: no interval to spread
    wide = tpot_spread_seconds(0.200, 0.9, 0.05, 4, 0.250)
    assert 0.200 + TPOT_Z * wide == pytest.approx(0.250)  # a step carries a chunk at most
    assert tpot_spread_seconds(0.250, 1.5, 0.05, 4, 0.250) == 0.0  # every step carries one already
    # Longer answers average more steps: the spread falls as 1 / sqrt(n).
    assert tpot_spread_seconds(0.050, 0.6, 0.01, 40, 1.0) == pytest.approx(tpot_spread_seconds(0.050, 0.6, 0.01, 10, 1.0) / 2)


def test_sums_stay_finite_over_a_long_run():
    inflow = PrefillInflow(window_s=0.1)
    for i in range(20000):  # 200 s, 2,000 windows: the stored sums are rebased as they go
        inflow.add(WorkerId("a"), 0.005, i * 0.01)
    n = decayed_count(20000, 0.01, 0.1)
    assert inflow.rate(WorkerId("a"), 199.99) == pytest.approx(0.5 * (n - 1) / n, rel=0.06)
    assert all(math.isfinite(v) for v in inflow._sums.values()) and math.isfinite(inflow._count)
    assert inflow.mean_work(WorkerId("a")) == pytest.approx(0.005) and all(math.isfinite(v) for v in inflow._counts.values())
    # Equal prompts at equal gaps: no spread (a renewal stream's work: spread_work).
    assert inflow.spread_work(WorkerId("a")) == pytest.approx(0.0, abs=1e-9) and all(math.isfinite(v) for v in inflow._squares.values())
    assert all(math.isfinite(v) for v in inflow._gaps[WorkerId("a")])


def test_admissions_landing_step_carries_the_mean_prompt_as_routing_does():
    """predictor.WorkerPerf.next_step_seconds, the scalar twin of _pricing.c's next_step: a
    step carries the arriving prefill's mean prompt work (PrefillInflow.mean_work), a chunk at most."""
    model = StepTimeModel((0.010, 0.001, 0.0, 0.002, 0.0), num_samples=10, mean_abs_pct_error=0.0)
    view = dataclasses.replace(make_worker_view("d", Role.DECODE, latency=model), chunk_tokens=8)  # a chunk: 8 ms of work
    assert WorkerPerf.of(view, 0.5, 0.0).next_step_seconds(0.030) == pytest.approx(0.034)
    assert WorkerPerf.of(view, 0.5, 0.0, 0.004).next_step_seconds(0.030) == pytest.approx(0.032)
    assert WorkerPerf.of(view, 0.5, 0.0, 0.050).next_step_seconds(0.030) == pytest.approx(0.034)
    # Prefill queued there: its steps fill their chunk from that backlog.
    queued = dataclasses.replace(view, load=dataclasses.replace(view.load, num_queued_prefill_tokens=4))
    assert WorkerPerf.of(queued, 0.5, 0.0, 0.004).next_step_seconds(0.030) == pytest.approx(0.034)


def test_a_decode_shares_its_steps_with_the_prefill_arriving():
    # A 20 ms decode step; a full chunk adds 300 ms of work.
    assert shared_step_seconds(0.020, 0.0, 0.3) == pytest.approx(0.020)
    assert shared_step_seconds(0.020, 0.5, 0.3) == pytest.approx(0.040)  # half of every second is prefill
    assert shared_step_seconds(0.020, 0.99, 0.3) == pytest.approx(0.320)  # at most one chunk per step
    assert shared_step_seconds(0.020, 3.0, 0.3) == pytest.approx(0.320)  # beyond capacity: every step carries a chunk


def test_a_step_absorbs_its_slack_of_the_arriving_prefill_once():
    """A model with a kink: each step computes `slack` of prefill work within its own time, once a
    step however many prompts it carries. T = step + inflow x T - slack: (step - slack) / (1 -
    inflow), never below the step alone, at most one chunk more."""
    assert shared_step_seconds(0.020, 0.2, 0.3, slack_s=0.010) == pytest.approx(0.020)  # the stream fits the slack
    assert shared_step_seconds(0.020, 0.6, 0.3, slack_s=0.010) == pytest.approx(0.025)  # 10 ms / 0.4
    assert shared_step_seconds(0.020, 3.0, 0.3, slack_s=0.010) == pytest.approx(0.320)


def test_a_stream_of_prompts_below_the_kink_is_work_all_the_same():
    """StepTimeModel.stream_work_seconds: a prompt's work as one of many sharing the steps counts
    all its tokens (the kink is a step's, paid once by slack_seconds); priced past the kink per
    prompt, a stream of 40-token prompts on a model with a 100-token kink was no work at all."""
    model = StepTimeModel((1e-3, 1e-5, 0.0, 1e-3, 0.0), num_samples=100, mean_abs_pct_error=0.0, free_prefill_tokens=100.0)
    assert model.prefill_work_seconds(40, 0, 512) == 0.0
    assert model.stream_work_seconds(40, 0, 512) == pytest.approx(40 * 1e-5)
    assert model.stream_work_seconds(0, 0, 512) == 0.0
    assert model.slack_seconds == pytest.approx(100 * 1e-5)

    def perf(inflow: float, carried_s: float = math.inf) -> WorkerPerf:
        return WorkerPerf(WorkerId("w"), model, 512, 16, 0, 0, 0, (), 0, prefill_inflow=inflow, carried_work_s=carried_s)

    p = predict(prompt_tokens=40, max_tokens=10, prefill_cached_tokens=0, prefill=perf(0.0), decode=perf(0.0))
    assert p.prefill_work_s == pytest.approx(40 * 1e-5)  # what the dispatch adds to the worker's inflow
    # 2,000 such prompts a second: 0.8 s of work per second, 1 ms of it absorbed by each 2 ms step.
    busy = predict(prompt_tokens=40, max_tokens=10, prefill_cached_tokens=0, prefill=perf(0.8), decode=perf(0.8))
    assert busy.tpot_s == pytest.approx((0.002 - 0.001) / (1 - 0.8))
    # A step landing among them carries one such prompt: its work past the step's slack, none here.
    assert perf(0.36, carried_s=40 * 1e-5).next_step_seconds(0.002) == pytest.approx(0.002)
    assert perf(0.36, carried_s=300 * 1e-5).next_step_seconds(0.002) == pytest.approx(0.002 + 0.36 * 200 * 1e-5)


def test_tpot_predictions_count_the_workers_inflow_and_dispatches_record_their_work():
    model = StepTimeModel((1e-3, 1e-5, 0.0, 1e-3, 0.0), num_samples=100, mean_abs_pct_error=0.0)

    def perf(inflow: float) -> WorkerPerf:
        return WorkerPerf(WorkerId("w"), model, 512, 16, 0, 0, 0, (), 0, prefill_inflow=inflow)

    quiet = predict(prompt_tokens=1000, max_tokens=10, prefill_cached_tokens=200, prefill=perf(0.0), decode=perf(0.0))
    busy = predict(prompt_tokens=1000, max_tokens=10, prefill_cached_tokens=200, prefill=perf(0.6), decode=perf(0.6))
    assert quiet.tpot_s == pytest.approx(0.002)
    assert busy.tpot_s == pytest.approx(0.002 / 0.4)
    # Its own prefill's work: 800 tokens x 10 us (the step overheads are not work it adds).
    assert busy.prefill_work_s == pytest.approx(0.008)
    # TTFT does not change: the prefill arriving after it queues behind it.
    assert busy.ttft_s == quiet.ttft_s


def test_the_evidence_of_a_stream_is_the_fleets():
    """Eight requests in the first 0.1 s, one per worker, are a stream: each worker's rate counts
    7/8 of its work (over the quarter-window divisor)."""
    inflow = PrefillInflow(window_s=2.0)
    for i in range(8):
        inflow.add(WorkerId(f"w{i}"), 0.2, i * 0.0125)
    now = 7 * 0.0125
    n = sum(math.exp(-(now - i * 0.0125) / 2.0) for i in range(8))
    expected = 0.2 * math.exp(-(now - 0.0) / 2.0) * (n - 1) / n / (2.0 * -math.expm1(-0.25))
    assert inflow.rate(WorkerId("w0"), now) == pytest.approx(expected, rel=1e-9)
    assert inflow.rate(WorkerId("w0"), now) > 0.35
