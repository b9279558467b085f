"""Issue 28: the index credits only routed blocks (core/index.py, credit_routed_only) and the
planner discounts load reports that the measured latency contradicts (core/trust.py)."""

from __future__ import annotations

import random

import pytest

from kvplane.block_hash import hash_blocks
from kvplane.controlplane.core.admission_base import Reject
from kvplane.controlplane.core.index import CacheIndex, ClearedEvent, RemovedEvent, StoredEvent
from kvplane.controlplane.core.planner import Outcome, Plan, Planner, PlannerConfig, ttft_kind
from kvplane.controlplane.core.pool import WorkerTable
from kvplane.controlplane.core.settings import ClusterSettings
from kvplane.controlplane.core.trust import ReportTrust, TrustConfig, with_excess
from kvplane.controlplane.core.views import ClusterView
from kvplane.latency import StepTimeModel
from kvplane.types import Tier, WorkerId

from .conftest import make_request, make_worker_view

A, B = WorkerId("a"), WorkerId("b")
PROMPT = list(range(40))  # 10 blocks of 4
HASHES = tuple(hash_blocks(PROMPT, 4, model_salt="m"))
STEP = StepTimeModel((0.001, 0.0001, 0.0, 0.0, 0.0), 100, 0.0)  # 1 ms + 0.1 ms per prefill token


def _matched(index: CacheIndex) -> dict[WorkerId, int]:
    return {w: s.num_blocks for w, s in index.overlaps(HASHES).items()}


# -- block credit --------------------------------------------------------------------------------


def test_announced_blocks_are_held_but_uncredited_until_a_routed_request_covers_them():
    index = CacheIndex(credit_routed_only=True)
    index.apply_snapshot(A, 0, {Tier.DEVICE: HASHES[:6], Tier.HOST: HASHES[4:6]})
    assert _matched(index) == {}
    assert (index.num_blocks(A), index.num_uncredited(A)) == (8, 6)
    assert index.blocks_by_tier()[A] == {Tier.DEVICE: 6, Tier.HOST: 2, Tier.DISK: 0}
    index.vouch(A, HASHES[:4])  # a request covering 4 of them: those 4 are credited at once
    assert _matched(index) == {A: 4} and index.num_uncredited(A) == 2
    index.vouch(A, HASHES)  # the whole prompt: the rest of the held ones now, the others when stored
    assert _matched(index) == {A: 6} and index.holder_tiers(HASHES[5], A) == frozenset({Tier.DEVICE, Tier.HOST})
    index.apply_batch(A, 1, [StoredEvent(HASHES[6:], Tier.DEVICE)])
    assert _matched(index) == {A: 10} and index.num_uncredited(A) == 0


def test_a_worker_advertising_blocks_routed_elsewhere_is_not_credited():
    index = CacheIndex(credit_routed_only=True)
    index.vouch(A, HASHES)
    index.apply_batch(A, 0, [StoredEvent(HASHES, Tier.DEVICE)])
    index.apply_batch(B, 0, [StoredEvent(HASHES, Tier.DEVICE)])  # b was never sent this prompt
    assert _matched(index) == {A: 10}
    # Blocks beyond the routed prompt (a generated answer) are not credited either.
    answer = tuple(hash_blocks([*PROMPT, 7, 7, 7, 7], 4, model_salt="m"))[10:]
    index.apply_batch(A, 1, [StoredEvent(answer, Tier.DEVICE)])
    assert index.num_uncredited(A) == 1 and not index.holds(answer[0], A)
    index.vouch(A, answer)  # ClusterState.answered: the control plane relayed that answer
    assert index.holds(answer[0], A)


def test_credit_survives_a_move_between_tiers_and_a_snapshot_that_still_lists_the_block():
    index = CacheIndex(credit_routed_only=True)
    index.vouch(A, HASHES[:2])
    index.apply_batch(A, 0, [StoredEvent(HASHES[:2], Tier.DEVICE)])
    # Offloaded: removed from the device before it is stored in host memory.
    index.apply_batch(A, 1, [RemovedEvent(HASHES[:1], Tier.DEVICE), StoredEvent(HASHES[:1], Tier.HOST)])
    assert index.fastest_tier(HASHES[0], A) is Tier.HOST
    index.apply_snapshot(A, 5, {Tier.HOST: HASHES[:1], Tier.DEVICE: HASHES[1:3]})  # 2 never routed there
    assert _matched(index) == {A: 2} and index.num_uncredited(A) == 1
    index.apply_batch(A, 6, [ClearedEvent()])
    assert _matched(index) == {} and index.num_blocks(A) == 0


def test_a_worker_id_that_leaves_and_comes_back_keeps_the_credit_of_what_was_routed_to_it():
    index = CacheIndex(credit_routed_only=True)
    index.vouch(A, HASHES[:3])
    index.apply_batch(A, 0, [StoredEvent(HASHES[:3], Tier.DISK)])
    index.remove_worker(A)  # a restarted agent: deregistered, then registered again
    assert _matched(index) == {} and index.last_seq(A) == -1
    index.apply_snapshot(A, 0, {Tier.DISK: HASHES[:5]})  # its disk blocks survived; 3 and 4 were never routed there
    assert _matched(index) == {A: 3} and index.num_uncredited(A) == 2


def test_vouches_waiting_for_their_blocks_are_bounded_per_worker():
    index = CacheIndex(credit_routed_only=True, max_vouched_per_worker=3)
    index.vouch(A, HASHES[:5])  # only the newest 3 wait
    index.apply_batch(A, 0, [StoredEvent(HASHES[:5], Tier.DEVICE)])
    assert [index.holds(h, A) for h in HASHES[:5]] == [False, False, True, True, True]
    with pytest.raises(ValueError, match="max_vouched_per_worker"):
        CacheIndex(credit_routed_only=True, max_vouched_per_worker=0)


def test_without_credit_routed_only_every_reported_block_counts_as_before():
    index = CacheIndex()
    index.vouch(A, HASHES[:1])  # a no-op
    index.apply_batch(B, 0, [StoredEvent(HASHES, Tier.DEVICE)])
    assert _matched(index) == {B: 10} and index.num_uncredited(B) == 0


# -- load reports against measured latency -------------------------------------------------------------


def test_reports_are_discounted_only_past_both_the_ratio_and_the_margin_and_only_for_a_while():
    trust = ReportTrust(TrustConfig())  # ratio 3, margin 0.25 s, weight 0.3, hold 30 s
    for _ in range(5):  # honest: 2x a tiny prediction is under the margin; 0.6 s against 0.5 s under the ratio
        trust.observe(A, predicted_s=0.01, measured_s=0.02, now=0.0)
        trust.observe(B, predicted_s=0.5, measured_s=0.6, now=0.0)
    assert trust.excess_s(A, 0.0) == 0.0 and trust.excess_s(B, 0.0) == 0.0
    trust.observe(A, predicted_s=0.01, measured_s=2.02, now=1.0)
    # measured mean 0.02 + 0.3 x 2.0 = 0.62 against predicted 0.01, past both bounds, but one late
    # request is no evidence (a warm-up, a pause of the machine): not discounted yet.
    assert trust.excess_s(A, 1.0) == 0.0
    trust.observe(A, predicted_s=0.01, measured_s=0.62, now=2.0)  # the second late one
    assert trust.excess_s(A, 2.0) == pytest.approx(0.62 - 0.01)
    assert trust.excess_s(A, 32.0) == pytest.approx(0.61) and trust.excess_s(A, 32.01) == 0.0
    # The prediction it is measured against excludes the discount that was in force then.
    trust.observe(A, predicted_s=0.62, measured_s=0.62, now=3.0, discount_s=0.61)
    assert trust.excess_s(A, 3.0) == pytest.approx(0.62 - 0.01)
    trust.forget(A)
    assert trust.excess_s(A, 2.0) == 0.0


def test_the_excess_becomes_queued_prefill_tokens_at_the_workers_own_rate():
    view = make_worker_view("a", latency=STEP, num_queued_prefill_tokens=100)
    # One 2048-token chunk (the default) takes 1 + 204.8 ms: 0.5 s is 2048 x 0.5 / 0.2058 tokens.
    assert with_excess(view, 0.5).load.num_queued_prefill_tokens == 100 + int(0.5 / 0.2058 * 2048)
    assert with_excess(make_worker_view("a"), 0.5).load.num_queued_prefill_tokens == 0  # no model: unchanged
    trust = ReportTrust(TrustConfig(report_contradiction_weight=1.0, report_contradiction_min_requests=1))
    trust.observe(A, 0.1, 1.1, now=0.0)
    table = WorkerTable((view, make_worker_view("b", latency=STEP)))
    discounted = trust.discounted(table, now=0.0)
    assert [v.load.num_queued_prefill_tokens for v in discounted.views] == [100 + int(1.0 / 0.2058 * 2048), 0]
    assert trust.discounted(table, now=31.0) is table


def test_the_discounted_workers_kept_aside_are_those_a_walk_over_every_worker_measured_finds():
    """A request looks only at the workers discounted after their last request (the walk over
    every worker measured cost 0.4-0.7 ms per request at 1,000 workers); random requests, lapses
    and workers forgotten, checked against that walk."""
    rng = random.Random(7)
    trust = ReportTrust(TrustConfig(report_contradiction_hold_s=5.0))
    workers = [WorkerId(f"w{i}") for i in range(12)]
    views = WorkerTable(tuple(make_worker_view(w, latency=STEP) for w in workers))
    now = 0.0
    for _ in range(3000):
        now += rng.expovariate(4.0)
        worker = rng.choice(workers)
        if rng.random() < 0.02:
            trust.forget(worker)
        else:
            trust.observe(worker, predicted_s=0.05, measured_s=rng.choice([0.05, 0.06, 0.9, 2.0]), now=now)
        probe_at = now = now + rng.choice([0.0, 0.0, 1.0, 4.9, 5.1])  # the planner's clock: it does not go back
        walked = {w: trust.excess_s(w, probe_at) for w in workers if trust.excess_s(w, probe_at) > 0}
        assert trust.num_discounted(probe_at) == len(walked)
        discounted = trust.discounted(views, probe_at)
        changed = {w for w, before, after in zip(workers, views.views, discounted.views) if before != after}
        assert changed == set(walked)
    assert 0 < len(walked) < len(workers)  # the draw reached both kinds of state


def test_one_late_request_is_no_evidence_but_two_of_the_last_eight_are():
    """A restarted worker's warm-up, or a pause of the machine, makes one request late: a prefix
    holder discounted for it lost its readers for 30 s. Two late requests among the last eight
    are evidence, also from a worker that serves every other request fast."""
    warm_up = ReportTrust(TrustConfig())
    warm_up.observe(A, predicted_s=0.02, measured_s=1.5, now=0.0)
    for i in range(1, 8):
        warm_up.observe(A, predicted_s=0.02, measured_s=0.02, now=i)
        assert warm_up.excess_s(A, i) == 0.0
    alternating = ReportTrust(TrustConfig())
    for i, measured in enumerate([1.5, 0.02, 1.5]):
        alternating.observe(B, predicted_s=0.02, measured_s=measured, now=i)
    # means: 1.5, then 1.5 - 0.3 x 1.48 = 1.056, then 1.056 + 0.3 x 0.444 = 1.189 against 0.02
    assert alternating.excess_s(B, 2.0) == pytest.approx(1.1892 - 0.02)
    with pytest.raises(ValueError, match="min_requests must be <= 8"):
        TrustConfig(report_contradiction_min_requests=9)
    with pytest.raises(ValueError, match="must be > 0"):
        TrustConfig(report_contradiction_min_requests=0)


def test_a_discount_is_logged_when_it_starts_and_counted_while_it_lasts(caplog):
    trust = ReportTrust(TrustConfig())
    with caplog.at_level("WARNING", logger="kvplane.controlplane.core.trust"):
        for i in range(3):  # late, late (discounted from here), late again
            trust.observe(A, predicted_s=0.02, measured_s=1.5, now=float(i))
        trust.observe(B, predicted_s=0.02, measured_s=0.02, now=2.0)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith("worker a: its load reports are discounted (+1.48 s of queue): 2 of its last 8")
    assert trust.num_discounted(2.0) == 1 and trust.num_discounted(32.01) == 0
    with caplog.at_level("WARNING", logger="kvplane.controlplane.core.trust"):
        trust.observe(A, predicted_s=0.02, measured_s=1.5, now=40.0)  # after the hold: a discount again, logged again
    assert len(caplog.records) == 2 and trust.num_discounted(40.0) == 1


def test_a_restarted_workers_slow_first_request_does_not_cost_it_the_next_ones():
    """Two idle workers; b's first request takes 1.5 s (its warm-up), every later request on either
    is as predicted. b is never discounted: it keeps its share of the next requests."""
    index = CacheIndex()
    planner = Planner(PlannerConfig(), rng=random.Random(0))
    settings = ClusterSettings()
    now, chosen = 0.0, []
    for i in range(12):
        cluster = ClusterView(
            (make_worker_view("a", latency=STEP, reported_at=now), make_worker_view("b", latency=STEP, reported_at=now)), index
        )
        plan = planner.plan(make_request([100 + i] * 40), cluster, settings, now)
        assert isinstance(plan, Plan)
        dispatch = planner.dispatched(plan, now)
        ttft = 1.5 if plan.decode_worker == "b" and "b" not in chosen else plan.prediction.ttft_s - plan.prediction.ttft_offset_s
        chosen.append(plan.decode_worker)
        planner.finished(dispatch, now + ttft, Outcome(ttft_s=ttft))
        assert planner.trust.excess_s(B, now + ttft) == 0.0
        now += ttft + 0.01
    assert chosen.count("b") >= 4  # the seeded draw between two idle workers, not a discount


def test_a_worker_reporting_idle_while_its_requests_run_late_loses_the_next_requests():
    """Two idle workers; whichever is chosen first keeps reporting idle while its requests take
    2 s against ~10 ms predicted. After two such requests the planner sends the next ones to the
    other (the idle reports alone tie them)."""
    index = CacheIndex()
    planner = Planner(PlannerConfig(), rng=random.Random(0))
    settings = ClusterSettings()
    now, chosen, slow = 0.0, [], None
    for i in range(8):
        cluster = ClusterView(
            (make_worker_view("a", latency=STEP, reported_at=now), make_worker_view("b", latency=STEP, reported_at=now)), index
        )
        plan = planner.plan(make_request([100 + i] * 40), cluster, settings, now)
        assert isinstance(plan, Plan)
        chosen.append(plan.decode_worker)
        slow = slow or plan.decode_worker
        dispatch = planner.dispatched(plan, now)
        ttft = 2.0 if plan.decode_worker == slow else plan.prediction.ttft_s - plan.prediction.ttft_offset_s  # honest: as its reports say
        planner.finished(dispatch, now + ttft, Outcome(ttft_s=ttft))
        planner.load_reported(A, now + ttft)
        planner.load_reported(B, now + ttft)
        now += ttft + 0.01
    other = "b" if slow == "a" else "a"
    second_late = [i for i, w in enumerate(chosen) if w == slow][1]  # the draw ties them until then
    assert chosen.count(slow) == 2 and chosen[second_late + 1 :] == [other] * (len(chosen) - second_late - 1)
    # 2 s measured against 5 ms predicted from its reports (1 ms + 40 x 0.1 ms), without the
    # calibration the planner learnt from its first late request (~2 s on every worker by the second).
    assert planner.trust.excess_s(WorkerId(slow), now) == pytest.approx(2.0 - 0.005)


def test_a_request_priced_with_a_discount_does_not_calibrate_the_fleet():
    """`a` is discounted (two 2 s requests against 5 ms predicted), then its queue drains: its next
    request, priced with ~2 s of discount, takes 5 ms. That miss is the discount's (trust.py
    learns from it), not something the model misses on every worker: the calibration must not
    learn -2 s from it and predict `b`'s next TTFT at 0 (seen in `kvplane bench load`: every TTFT
    predicted 0 s after an overload, and predictive admission let a 3x overload in)."""
    index = CacheIndex()
    planner = Planner(PlannerConfig(), rng=random.Random(0))
    settings = ClusterSettings()
    for i in range(2):
        planner.trust.observe(A, 0.005, 2.0, now=0.1 * i)
    a, b = make_worker_view("a", latency=STEP, reported_at=1.0), make_worker_view("b", latency=STEP, reported_at=1.0)
    plan = planner.plan(make_request([100] * 40), ClusterView((a,), index), settings, 1.0)
    assert isinstance(plan, Plan) and plan.prediction.ttft_s > 1.5  # the discount priced in
    dispatch = planner.dispatched(plan, 1.0)
    planner.finished(dispatch, 1.005, Outcome(ttft_s=0.005))
    assert planner.calibration.offset(ttft_kind(False), 1.005) == 0.0
    on_b = planner.plan(make_request([200] * 40), ClusterView((b,), index), settings, 1.01)
    assert isinstance(on_b, Plan) and on_b.prediction.ttft_s == pytest.approx(0.005)
    assert planner.trust.excess_s(A, 1.005) < 2.0 - 0.005  # trust did learn from it


def _hiccups(planner: Planner, worker: str, index: CacheIndex, ttft_s: float) -> float:
    """Two requests on `worker` alone (admission `none`) taking `ttft_s` against 5 ms predicted:
    its reports are discounted from the second. Returns the time after them."""
    now = 0.0
    for i in range(2):
        view = make_worker_view(worker, latency=STEP, reported_at=now)
        plan = planner.plan(make_request([100 + i] * 40), ClusterView((view,), index), ClusterSettings({"admission.policy": "none"}), now)
        planner.finished(planner.dispatched(plan, now), now + ttft_s, Outcome(ttft_s=ttft_s))
        now += ttft_s + 0.1
    assert planner.trust.excess_s(WorkerId(worker), now) > 1.0
    return now


PREDICTIVE_500_MS = ClusterSettings({"admission.policy": "predictive", "objectives.*.interactive.ttft_ms": "500"})


def test_a_worker_serving_alone_is_probed_back_after_a_pause_instead_of_refused_for_the_hold():
    """One worker, two requests held up 1.5 s (a pause): its reports are discounted for up to 30 s.
    Predictive admission would refuse everything meanwhile, as the discount alone puts every
    prediction over the 500 ms objective and a refused request measures nothing. One request at
    a time is admitted to measure it again (a probe); as they come back on time the discount ends
    and requests are admitted as usual."""
    index, planner = CacheIndex(), Planner(PlannerConfig(), rng=random.Random(0))
    now = _hiccups(planner, "a", index, 1.5) + 10.0  # the calibration's share of the pause has faded below the objective
    probes = 0
    while True:
        cluster = ClusterView((make_worker_view("a", latency=STEP, reported_at=now),), index)
        plan = planner.plan(make_request([200 + probes] * 40), cluster, PREDICTIVE_500_MS, now)
        assert isinstance(plan, Plan), plan  # refused before the probes
        if not plan.probe:
            break
        assert plan.prediction.ttft_s > 0.5  # the discount priced in: only a probe is admitted
        dispatch = planner.dispatched(plan, now)
        # While the probe runs, the next request is refused: one at a time.
        assert isinstance(planner.plan(make_request([999] * 40), cluster, PREDICTIVE_500_MS, now), Reject)
        planner.finished(dispatch, now + 0.005, Outcome(ttft_s=0.005))  # on time
        probes += 1
        now += 0.01
        assert probes <= 8
    assert planner.trust.excess_s(A, now) == 0.0 and probes >= 1


def test_a_worker_that_stays_late_gets_one_probe_at_a_time():
    index, planner = CacheIndex(), Planner(PlannerConfig(), rng=random.Random(0))
    now = _hiccups(planner, "a", index, 1.5) + 10.0
    for i in range(5):
        cluster = ClusterView((make_worker_view("a", latency=STEP, reported_at=now),), index)
        plan = planner.plan(make_request([300 + i] * 40), cluster, PREDICTIVE_500_MS, now)
        assert isinstance(plan, Plan) and plan.probe
        dispatch = planner.dispatched(plan, now)
        assert isinstance(planner.plan(make_request([999] * 40), cluster, PREDICTIVE_500_MS, now), Reject)
        now += 1.5
        planner.finished(dispatch, now, Outcome(ttft_s=1.5))  # late again
        assert planner.trust.excess_s(A, now) > 1.0


def test_a_probe_is_admitted_only_where_the_tpot_meets_its_objective_as_admission_holds_it():
    """A probe lifts the discount, not the TPOT's spread (predictor.tpot_spread_seconds): on a
    worker taking a stream of prompts, a TPOT whose mean meets the objective and whose 95 %
    point does not is refused, probe or not."""
    index, planner = CacheIndex(), Planner(PlannerConfig(), rng=random.Random(0))
    now = _hiccups(planner, "a", index, 1.5) + 10.0
    for i in range(40):  # 40 prompts of 20 ms of work in 1 s: 0.8 s of prefill a second
        planner.inflow.add(A, 0.020, now - 1.0 + i / 40)
    cluster = ClusterView((make_worker_view("a", latency=STEP, reported_at=now),), index)
    p = planner.route(make_request([400] * 40, max_tokens=4), cluster, PREDICTIVE_500_MS, now).options[0].prediction
    assert p.tpot_spread_s > 0 and p.tpot_high_ms > p.tpot_ms
    between = (p.tpot_ms + p.tpot_high_ms) / 2
    tight = ClusterSettings({**PREDICTIVE_500_MS.values, "objectives.*.interactive.tpot_ms": f"{between}"})
    assert isinstance(planner.plan(make_request([400] * 40, max_tokens=4), cluster, tight, now), Reject)
    roomy = ClusterSettings({**PREDICTIVE_500_MS.values, "objectives.*.interactive.tpot_ms": f"{p.tpot_high_ms + 1}"})
    plan = planner.plan(make_request([400] * 40, max_tokens=4), cluster, roomy, now)
    assert isinstance(plan, Plan) and plan.probe


def test_after_slow_requests_the_calibration_is_measured_again_by_one_probe_at_a_time():
    """One slow request on worker b (1.5 s against 5 ms predicted) makes the fleet's TTFT
    calibration add 1.5 s to every prediction: an idle worker a is predicted over the 500 ms
    objective, and predictive admission would refuse everything until the offset had faded.
    Instead the router's placement is admitted as a calibration probe, one at a time, while only
    the offset refuses it; as the probes come back on time the offset falls and requests are
    admitted as usual."""
    index, planner = CacheIndex(), Planner(PlannerConfig(), rng=random.Random(0))
    slow = planner.plan(make_request([100] * 40), ClusterView((make_worker_view("b", latency=STEP),), index), ClusterSettings(), 0.0)
    planner.finished(planner.dispatched(slow, 0.0), 1.5, Outcome(ttft_s=1.5))
    now = 1.6
    cluster = ClusterView((make_worker_view("a", latency=STEP, reported_at=now),), index)
    assert planner.trust.excess_s(A, now) == 0.0 and planner.calibration.offset(ttft_kind(False), now) > 1.0
    probes = 0
    while True:
        plan = planner.plan(make_request([200 + probes] * 40), cluster, PREDICTIVE_500_MS, now)
        assert isinstance(plan, Plan), plan
        if not plan.probe:
            break
        assert plan.probe == "calibration" and plan.prediction.ttft_s > 0.5
        dispatch = planner.dispatched(plan, now)
        assert isinstance(planner.plan(make_request([999] * 40), cluster, PREDICTIVE_500_MS, now), Reject)  # one at a time
        raw_s = plan.prediction.ttft_s - plan.prediction.ttft_offset_s
        planner.finished(dispatch, now + raw_s, Outcome(ttft_s=raw_s))  # as the model said
        probes += 1
        now += 0.01
        assert probes <= 10
    assert probes >= 3 and plan.prediction.ttft_s <= 0.5


def test_no_calibration_probe_while_an_admitted_request_is_under_way():
    """A request in flight measures the model anyway; a probe then would be a placement the
    calibration refused, whose outcome teaches it to refuse more."""
    index, planner = CacheIndex(), Planner(PlannerConfig(), rng=random.Random(0))
    cluster_b = ClusterView((make_worker_view("b", latency=STEP),), index)
    slow = planner.plan(make_request([100] * 40), cluster_b, ClusterSettings(), 0.0)
    planner.finished(planner.dispatched(slow, 0.0), 1.5, Outcome(ttft_s=1.5))
    planner.dispatched(planner.plan(make_request([101] * 40), cluster_b, ClusterSettings({"admission.policy": "none"}), 1.5), 1.5)
    cluster = ClusterView((make_worker_view("a", latency=STEP, reported_at=1.6),), index)
    assert isinstance(planner.plan(make_request([200] * 40), cluster, PREDICTIVE_500_MS, 1.6), Reject)


def test_no_calibration_probe_where_the_model_itself_misses_the_objective():
    index, planner = CacheIndex(), Planner(PlannerConfig(), rng=random.Random(0))
    slow = planner.plan(make_request([100] * 40), ClusterView((make_worker_view("b", latency=STEP),), index), ClusterSettings(), 0.0)
    planner.finished(planner.dispatched(slow, 0.0), 1.5, Outcome(ttft_s=1.5))
    # 10,000 queued prefill tokens: 1 s by the model alone, over the 500 ms objective.
    queued = ClusterView((make_worker_view("a", latency=STEP, reported_at=1.6, num_queued_prefill_tokens=10_000),), index)
    assert isinstance(planner.plan(make_request([200] * 40), queued, PREDICTIVE_500_MS, 1.6), Reject)


def test_trust_switched_off_discounts_no_worker():
    """What kvplane sim gives the routing policies other than kvplane's own."""
    off = ReportTrust(TrustConfig())
    off.enabled = False
    for i in range(8):
        off.observe(A, predicted_s=0.02, measured_s=1.5, now=i)
    assert off.excess_s(A, 8.0) == 0.0 and not off.may_discount
