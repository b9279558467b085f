"""The request planner, driven with plain data only: placement, rejection, fetch, calibration,
link rate, and the load it charges and releases (the agent-loop scenario of issue #8).
Fleet defaults (conftest): model "m", block size 4, 100-block workers."""

from __future__ import annotations

import random

import pytest

from kvplane.block_hash import hash_blocks
from kvplane.controlplane.core.admission_base import AdmissionConfig, Reject, RejectKind
from kvplane.controlplane.core.index import CacheIndex, StoredEvent
from kvplane.controlplane.core.planner import Outcome, Plan, Planner, PlannerConfig, ttft_kind
from kvplane.controlplane.core.predictor import tpot_spread_seconds
from kvplane.controlplane.core.settings import ClusterSettings
from kvplane.controlplane.core.views import ClusterView
from kvplane.latency import StepTimeModel
from kvplane.types import DisaggMode, Role, Tier, WorkerId
from tests.core.conftest import make_router_config

PROMPT_40 = list(range(200, 240))  # 10 full blocks
OTHER_40 = list(range(600, 640))  # another prompt of 10 blocks, sharing none of PROMPT_40's
TOKEN_S = 1 / 20000  # the routing policy's seconds per prefill token for a worker without a step-time model
# 1 ms per step + 10 us per prefill token + 1 ms per decoded sequence.
STEP_MODEL = StepTimeModel(coefficients=(1e-3, 1e-5, 0.0, 1e-3, 0.0), num_samples=100, mean_abs_pct_error=0.0)
NO_SETTINGS = ClusterSettings()


def planner(seed: int = 0, admission_policy: str = "threshold", admission: AdmissionConfig | None = None, **router) -> Planner:
    config = PlannerConfig(router=make_router_config(**router), admission_policy=admission_policy, admission=admission or AdmissionConfig())
    return Planner(config, rng=random.Random(seed))


def test_places_the_request_on_the_prefix_holder_and_charges_it(index, cache_prefix, worker_view, route_request):
    cache_prefix("holder", PROMPT_40, 6)
    cluster = ClusterView((worker_view("holder", num_used_blocks=2), worker_view("idle")), index)
    plan = planner().plan(route_request(PROMPT_40, max_tokens=16), cluster, NO_SETTINGS, now=0.0)
    assert isinstance(plan, Plan)
    # Predicted TTFT (no step-time models: the fallback 20,000 tokens/s): holder computes 16
    # tokens, idle 40.
    assert [(c.worker_id, c.cost) for c in plan.decision.candidates] == [("holder", 16 * TOKEN_S), ("idle", 40 * TOKEN_S)]
    assert (plan.decode_worker, plan.prefill_worker, plan.fetch_from, plan.cached_tokens) == ("holder", None, None, 24)
    assert [o.decode_worker for o in plan.options] == ["holder", "idle"]
    # 40 prompt + 16 output tokens = 14 blocks, 6 of them cached; 40 - 24 tokens to compute.
    [charge] = plan.charges
    assert (charge.worker_id, charge.prefill_tokens, charge.num_blocks, charge.num_new_blocks, charge.decodes) == (
        "holder", 16, 14, 8, True,
    )  # fmt: skip


def test_rejects_with_the_reason_kind_and_retry_after_of_the_policy(index, worker_view, route_request):
    cluster = ClusterView((worker_view("w1", num_running=80), worker_view("w2", num_running=96)), index)
    verdict = planner().plan(route_request(PROMPT_40), cluster, NO_SETTINGS, now=0.0)
    # Least over: w1 at (80 - 64) / 64 = 0.25: retry 1.0 x 1.25.
    assert verdict == Reject(
        reason="all 2 candidates over limits: w1 (running 80>64); w2 (running 96>64)",
        retry_after_s=1.25,
        kind=RejectKind.RUNNING,
    )


def test_the_run_time_setting_chooses_the_admission_policy(index, worker_view, route_request):
    cluster = ClusterView((worker_view("w1", num_running=80),), index)
    p = planner()
    assert isinstance(p.plan(route_request(PROMPT_40), cluster, NO_SETTINGS, now=0.0), Reject)
    admit_all = ClusterSettings({"admission.policy": "none"})
    assert p.admission_policy_name(admit_all) == "none"
    assert isinstance(p.plan(route_request(PROMPT_40), cluster, admit_all, now=0.0), Plan)


def test_fetches_from_a_busy_holder_and_charges_only_what_is_left(index, cache_prefix, worker_view, route_request):
    cache_prefix("holder", PROMPT_40, 10)
    busy = worker_view("holder", num_queued_prefill_tokens=100, block_nbytes=8192)
    cluster = ClusterView((busy, worker_view("idle", block_nbytes=8192)), index)
    p = planner(fetch_overhead_ms=1.0, prefill_tokens_per_s=1000.0)
    plan = p.plan(route_request(PROMPT_40, disagg=DisaggMode.AUTO, max_tokens=16), cluster, NO_SETTINGS, now=0.0)
    assert isinstance(plan, Plan)
    # 9 blocks (the last prompt block is always computed) come from the holder: 36 tokens. At the
    # planner's initial 1 GB/s: 1 ms + 9 x 8 kB / 1 GB/s, then 4 tokens at 1 ms: 5.07 ms, against
    # 40 ms computing the prompt on idle and 104 ms on the holder behind its queue.
    assert plan.decision.candidates[0].cost == pytest.approx(0.001 + 9 * 8192 / 1e9 + 0.004, rel=1e-12)
    assert (plan.decode_worker, plan.fetch_from, plan.fetch_tokens) == ("idle", "holder", 36)
    [charge] = plan.charges
    assert (charge.worker_id, charge.prefill_tokens, charge.num_blocks, charge.num_new_blocks) == ("idle", 4, 14, 5)


def test_admission_moving_the_request_drops_the_routers_fetch(index, cache_prefix, worker_view, route_request):
    cache_prefix("holder", PROMPT_40, 10)
    # 1 ms a step, 1 ms a prefill token, 1 ms a sequence in the batch, 1 us a context token.
    model = StepTimeModel(coefficients=(1e-3, 1e-3, 0.0, 1e-3, 1e-6), num_samples=100, mean_abs_pct_error=0.0)
    kw = dict(latency=model, block_nbytes=8192, running_context_tokens=10_000)
    cluster = ClusterView(
        (
            worker_view("holder", num_running=10, num_queued_prefill_tokens=100, running_remaining_tokens=[100] * 10, **kw),
            worker_view("idle", num_running=10, num_waiting=10, running_remaining_tokens=[100] * 10, **kw),
        ),
        index,
    )
    p = planner(admission_policy="predictive", fetch_overhead_ms=1.0)
    settings = ClusterSettings({"objectives.*.interactive.tpot_ms": "40", "objectives.*.interactive.ttft_ms": "200"})
    routed = p.route(route_request(PROMPT_40, disagg=DisaggMode.AUTO), cluster, settings, now=0.0)
    # The router: both first wait for the rest of the step in flight (half of 1 + 10 + 10 ms:
    # 10.5 ms). idle fetches the holder's 9 blocks meanwhile (1.07 ms) and computes 4 tokens in a
    # step carrying its 20 requests (1 + 20 + 10 ms + 4 ms): 45.5 ms; its TPOT, the batch + this
    # request (21 ms) and their context (10,000 + 40 + 16 / 2 tokens: 10.05 ms) + 1 ms, is 32.05
    # ms <= 40. The holder waits for its queue too (21.1 + 100 ms), then 25.1 ms. Each computes 4
    # ms, delaying its decodes, a ms of each worth 200 / (40 x 16 / 2) = 0.625 of a prompt's:
    # idle spends 45.5 + 4 x (1 + 20 x 0.625) = 99.5 ms, the holder 146.2 + 4 x 7.25 = 175.2.
    assert (routed.decision.decode_worker, routed.decision.fetch_from) == ("idle", "holder")
    idle, holder = routed.decision.candidates
    assert (idle.cost, idle.detail.tpot_s) == (pytest.approx(0.0105 + 0.035, rel=1e-9), pytest.approx(0.032048, rel=1e-9))
    assert holder.cost == pytest.approx(0.0105 + 0.1211 + 0.0251, rel=1e-9)
    # Admission predicts TPOT at the request's arrival, its waiting requests at the running ones' mean
    # context (1,000 tokens): idle 1 + 21 + 20.048 = 42.048 ms > 40; holder 1 + 11 + 10.048 ms.
    assert [round(o.prediction.tpot_ms, 6) for o in routed.options] == [42.048, 22.048]
    plan = p.admit(routed, settings)
    assert isinstance(plan, Plan)
    assert (plan.decode_worker, plan.follows_router, plan.fetch_from, plan.fetch_tokens, plan.cached_tokens) == (
        "holder", False, None, 0, 0,
    )  # fmt: skip
    assert p.admissible(routed, settings) == {"idle": False, "holder": True}


def test_a_finished_request_calibrates_the_next_prediction(index, worker_view, route_request):
    cluster = ClusterView((worker_view("w", latency=STEP_MODEL),), index)
    p = planner(admission_policy="none")
    request = route_request(PROMPT_40, max_tokens=4)
    first = p.plan(request, cluster, NO_SETTINGS, now=0.0)
    assert isinstance(first, Plan) and first.prediction is not None
    # One step of 40 prefill tokens on an idle worker (nothing else decoding): 1 ms + 0.4 ms.
    assert first.prediction.ttft_s == pytest.approx(0.0014)
    dispatch = p.dispatched(first, now=0.0)
    p.prefill_ended(dispatch, now=0.05)
    p.finished(dispatch, now=0.2, outcome=Outcome(ttft_s=0.0514, tpot_s=None))
    # The first residual is taken whole: +50 ms on later local TTFT predictions; TPOT unchanged.
    # (Another prompt: the first one's now counts as cached on w, a predicted prefix.)
    second = p.plan(route_request(OTHER_40, max_tokens=4), cluster, NO_SETTINGS, now=0.2)
    assert second.prediction.ttft_s == pytest.approx(0.0514) and second.prediction.ttft_offset_s == pytest.approx(0.05)
    # TPOT unchanged: one request routed there is no stream of prefill yet (inflow.py).
    assert p.inflow.rate(WorkerId("w"), 0.2) == 0.0
    assert second.prediction.tpot_s == pytest.approx(first.prediction.tpot_s)


def test_a_workers_prefill_stream_spreads_the_tpot_predicted_there(index, worker_view, route_request):
    """Dispatches record their prefill work (inflow.py); the next prediction on that worker
    carries the spread of its TPOT at the worker's inflow and the prompts' spread_work: alike
    prompts in pairs every 20 ms, E[w] x c_a^2: 19 gaps, 10 of 0 and 9 of 20 ms, whose squared
    coefficient of variation is 19 / 9 - 1 (the decay over 0.2 s of a 2 s window aside)."""
    cluster = ClusterView((worker_view("w", latency=STEP_MODEL),), index)
    p = planner(admission_policy="none")
    for i in range(20):
        now = 0.02 * (i // 2)
        plan = p.plan(route_request([2000 + 40 * i + k for k in range(40)], max_tokens=9), cluster, NO_SETTINGS, now=now)
        p.dispatched(plan, now=now)
    w = WorkerId("w")
    spread_work = p.inflow.spread_work(w)
    assert p.inflow.rate(w, 0.2) > 0 and spread_work == pytest.approx(40 * 1e-5 * (19 / 9 - 1), rel=0.01)
    plan = p.plan(route_request(OTHER_40, max_tokens=9), cluster, NO_SETTINGS, now=0.2)
    prediction = plan.prediction
    assert prediction.tpot_spread_s > 0
    inflow = p.inflow.rate(w, 0.2)
    step_s = prediction.tpot_s * (1.0 - inflow)  # shared_step_seconds, no slack, below its bound
    bound_s = step_s + STEP_MODEL.prefill_work_seconds(512, 0, 512)  # a step carries a chunk at most
    assert prediction.tpot_spread_s == pytest.approx(tpot_spread_seconds(prediction.tpot_s, inflow, spread_work, 8, bound_s), rel=1e-9)


def test_a_calibration_pushed_below_zero_by_an_overload_comes_back_with_the_next_requests(index, worker_view, route_request):
    """One request predicted over 10 s behind a queue that drained fast (an overload whose callers
    gave up) took 0.1 s: the offset falls below -10 s and idle predictions clamp to 0. The next
    requests, each 10 ms over the model, bring it back: it learns from their raw predictions, not
    from the clamped ones (which made it keep that offset for as long as requests came)."""
    p = planner(admission_policy="none")
    queued = ClusterView((worker_view("w", latency=STEP_MODEL, num_queued_prefill_tokens=1_000_000),), index)
    first = p.plan(route_request(PROMPT_40, max_tokens=4), queued, NO_SETTINGS, now=1.0)
    assert first.prediction.ttft_s > 10.0
    p.finished(p.dispatched(first, now=1.0), now=1.0, outcome=Outcome(ttft_s=0.1, tpot_s=None))
    assert p.calibration.offset(ttft_kind(False), now=1.0) == pytest.approx(0.1 - first.prediction.ttft_s)
    idle = ClusterView((worker_view("w", latency=STEP_MODEL),), index)
    for i in range(40):
        plan = p.plan(route_request([1000 + i] * 40, max_tokens=4), idle, NO_SETTINGS, now=1.0)
        raw_s = plan.prediction.ttft_s - plan.prediction.ttft_offset_s
        assert raw_s == pytest.approx(0.0014)  # the model's own prediction, clamped or not
        p.finished(p.dispatched(plan, now=1.0), now=1.0, outcome=Outcome(ttft_s=raw_s + 0.010, tpot_s=None))
    assert p.calibration.offset(ttft_kind(False), now=1.0) == pytest.approx(0.010, abs=0.002)


def test_slow_local_requests_do_not_make_an_unmeasured_remote_prefill_look_faster(index, worker_view, route_request):
    workers = tuple(worker_view(w, latency=STEP_MODEL, block_nbytes=1000) for w in ("a", "b"))
    cluster = ClusterView(workers, index)
    p = planner(admission_policy="none")
    first = p.plan(route_request(PROMPT_40, max_tokens=4), cluster, NO_SETTINGS, now=0.0)
    assert first.prefill_worker is None  # both idle: prefilling at home beats prefill + transfer
    dispatch = p.dispatched(first, now=0.0)
    p.finished(dispatch, now=0.2, outcome=Outcome(ttft_s=first.prediction.ttft_s + 0.05, tpot_s=None))
    # Local TTFTs measured 50 ms over the model. A remote prefill misses what a local one does and
    # more (its offset rests on the local one), so it still loses by its transfer and tail step.
    second = p.plan(route_request(OTHER_40, max_tokens=4), cluster, NO_SETTINGS, now=0.2)
    assert second.prefill_worker is None and second.prediction.ttft_offset_s == pytest.approx(0.05)
    assert p.calibration.offset(ttft_kind(True), now=0.2) == pytest.approx(0.05)


def test_a_decoding_request_s_tpot_so_far_calibrates_before_it_finishes(index, worker_view, route_request):
    cluster = ClusterView((worker_view("w", latency=STEP_MODEL),), index)
    p = planner(admission_policy="none")
    first = p.plan(route_request(PROMPT_40, max_tokens=64), cluster, NO_SETTINGS, now=0.0)
    dispatch = p.dispatched(first, now=0.0)
    p.prefill_ended(dispatch, now=0.01)
    # 16 tokens in, each 30 ms apart where the model predicted first.prediction.tpot_s: the
    # residual is taken whole (the first one), while the request still runs.
    p.decoding(dispatch, now=0.5, tpot_s=first.prediction.tpot_s + 0.03)
    second = p.plan(route_request(OTHER_40, max_tokens=64), cluster, NO_SETTINGS, now=0.5)
    assert second.prediction.tpot_offset_s == pytest.approx(0.03)
    p.decoding(12345, now=0.6, tpot_s=9.0)  # an unknown (finished, forgotten) dispatch: ignored
    third = p.plan(route_request(OTHER_40, max_tokens=64), cluster, NO_SETTINGS, now=0.6)
    assert third.prediction.tpot_offset_s == pytest.approx(0.03 * 0.5 ** (0.1 / 5.0))  # only faded (half-life 5 s)


def test_a_measured_transfer_teaches_the_link_rate(index, worker_view, route_request):
    workers = (worker_view("d", latency=STEP_MODEL, block_nbytes=1_000_000), worker_view("p", Role.PREFILL, latency=STEP_MODEL))
    cluster = ClusterView(workers, index)
    p = planner(admission_policy="none")
    request = route_request(PROMPT_40, disagg=DisaggMode.ALWAYS, max_tokens=4)
    plan = p.plan(request, cluster, NO_SETTINGS, now=0.0)
    # 10 full blocks of 1 MB at the initial 1 GB/s: 10 ms.
    assert (plan.prefill_worker, plan.prediction.transfer_s) == ("p", pytest.approx(0.010))
    p.finished(p.dispatched(plan, now=0.0), now=1.0, outcome=Outcome(kv_transfer_bytes=10_000_000, kv_transfer_s=0.002))
    # 5 GB/s measured: 1 + 0.2 x (5 - 1) = 1.8 GB/s. (Another prompt: the first one's KV now
    # counts as on d, a predicted prefix, so nothing would move.)
    other = route_request(OTHER_40, disagg=DisaggMode.ALWAYS, max_tokens=4)
    assert p.plan(other, cluster, NO_SETTINGS, now=1.0).prediction.transfer_s == pytest.approx(0.01 / 1.8)


def test_a_prefill_worker_is_charged_the_prompt_after_the_prefix_it_holds(index, cache_prefix, worker_view, route_request):
    cache_prefix("p", PROMPT_40, 6)  # a shared system prompt, say: 24 of the 40 tokens
    workers = (worker_view("d", latency=STEP_MODEL), worker_view("p", Role.PREFILL, latency=STEP_MODEL))
    plan = planner(admission_policy="none").plan(
        route_request(PROMPT_40, disagg=DisaggMode.ALWAYS, max_tokens=4), ClusterView(workers, index), NO_SETTINGS, now=0.0
    )
    decode, prefill = plan.charges
    # As the prediction counts it (16 tokens to compute there); counted whole, each request sent
    # there made its queue look longer by the prefix, and held that as a floor until its end.
    assert (prefill.worker_id, prefill.prefill_tokens, prefill.decodes) == ("p", 16, False)
    assert plan.prediction.prefill_s == pytest.approx(1e-3 + 16 * 1e-5, rel=1e-9)
    assert (decode.worker_id, decode.prefill_tokens, decode.imported) == ("d", 0, True)


def test_agent_loop_steps_stay_on_the_prefix_holder():
    """Issue #8: four `both` workers; each step of a tool loop is sent right after the previous
    one finished and extends its prompt (+ its 16 output tokens + 8 new ones). The holder's last
    load report still shows the finished step running with its blocks in use; the planner has
    released them at the finish, so every step stays on the holder and recomputes only 2 blocks."""
    index = CacheIndex()
    workers = [WorkerId(f"both-{i}") for i in range(4)]
    reports = {w: _load_view(w) for w in workers}
    p = planner(seed=3)
    prompt, seq, now, holder = list(range(40)), 0, 0.0, None
    for step in range(8):
        cluster = ClusterView(tuple(reports[w] for w in workers), index)
        plan = p.plan(_request(prompt), cluster, NO_SETTINGS, now)
        assert isinstance(plan, Plan)
        holder = holder or plan.decode_worker
        blocks = len(prompt) // 4
        if step:
            assert plan.decode_worker == holder, f"step {step} left the holder"
            # Predicted TTFT: the holder computes 2 blocks (8 tokens) and nothing is queued there
            # (released); the others compute the whole prompt; all + the calibration's offset.
            offset = p.calibration.offset(ttft_kind(False), now)
            costs = {c.worker_id: c.cost for c in plan.decision.candidates}
            assert costs == {w: ((8 if w == holder else 4 * blocks) * TOKEN_S + offset) for w in workers}
        dispatch = p.dispatched(plan, now)
        held = (len(prompt) + 16) // 4  # the prompt and its output, in full blocks
        # The engine reports the step queued, then running, then stores its blocks; it finishes.
        reports[holder] = _load_view(holder, waiting=1, queued=len(prompt) - plan.cached_tokens)
        p.load_reported(holder, now + 0.05)
        p.prefill_ended(dispatch, now + 0.1)
        reports[holder] = _load_view(holder, running=1, used=held)
        p.load_reported(holder, now + 0.25)
        hashes = hash_blocks(prompt + [500 + step] * 16, 4, model_salt="m")
        assert index.apply_batch(holder, seq, [StoredEvent(tuple(hashes), Tier.DEVICE)])
        p.kv_stored(holder, hashes)
        seq += 1
        p.finished(dispatch, now + 0.4, Outcome(ttft_s=0.1, tpot_s=0.01))
        if step % 2:
            p.load_reported(holder, now + 0.41)  # sampled before the finish: still released
        now += 0.401  # the next step goes out right away
        prompt = prompt + [500 + step] * 16 + [900 + step] * 8


def _load_view(worker_id: WorkerId, running: int = 0, waiting: int = 0, queued: int = 0, used: int = 0):
    from tests.core.conftest import make_worker_view

    return make_worker_view(
        worker_id, Role.BOTH, num_running=running, num_waiting=waiting, num_queued_prefill_tokens=queued, num_used_blocks=used
    )


def _request(prompt: list[int]):
    from tests.core.conftest import make_request

    return make_request(prompt, max_tokens=16, disagg=DisaggMode.NEVER)


def test_out_of_routing_workers_are_skipped_and_their_absence_is_transient(index, worker_view, route_request):
    from kvplane.controlplane.core.routing import NoCandidateError

    p = planner()
    cluster = ClusterView((worker_view("a", reported_at=0.0), worker_view("b", reported_at=0.0)), index, store_ok_at=0.0)
    p.worker_stalled(WorkerId("a"), now=0.0)
    plan = p.plan(route_request(PROMPT_40), cluster, NO_SETTINGS, now=0.5)
    assert plan.decode_worker == "b" and [c.worker_id for c in plan.decision.candidates] == ["b"]
    p.worker_stalled(WorkerId("b"), now=0.5)
    with pytest.raises(NoCandidateError, match=r"out of routing for now: a: stalled a request .*; b: stalled") as info:
        p.plan(route_request(PROMPT_40), cluster, NO_SETTINGS, now=1.0)
    assert info.value.transient
    # A deployment without the worker at all is not transient.
    with pytest.raises(NoCandidateError) as info:
        planner().plan(route_request(PROMPT_40, model="other"), cluster, NO_SETTINGS, now=1.0)
    assert not info.value.transient


def test_place_skips_admission_for_a_migrating_request(index, worker_view, route_request):
    cluster = ClusterView((worker_view("w1", num_running=80),), index)
    p = planner()
    assert isinstance(p.plan(route_request(PROMPT_40), cluster, NO_SETTINGS, now=0.0), Reject)
    plan = p.place(route_request(PROMPT_40), cluster, NO_SETTINGS, now=0.0)
    assert (plan.decode_worker, plan.prefill_worker) == ("w1", None)
