"""Predictor, predictive admission and run-time settings, with exact numbers from a known model."""

from __future__ import annotations

import dataclasses

import pytest

from kvplane.controlplane.core.admission import make_admission_policy
from kvplane.controlplane.core.admission_base import AdmissionConfig, Admit, PlacementOption, Reject, RejectKind
from kvplane.controlplane.core.predictor import (
    TPOT_Z,
    Calibration,
    LinkRate,
    Prediction,
    WorkerPerf,
    blocks_to_transfer,
    predict,
    tpot_recovery_s,
    tpot_spread_seconds,
)
from kvplane.controlplane.core.routing import RouteRequest
from kvplane.controlplane.core.settings import DEFAULT_OBJECTIVES, ClusterSettings, SettingError, validate_setting
from kvplane.latency import StepTimeModel
from kvplane.types import DisaggMode, Objective, WorkerId

# 1 ms per step + 10 us per prefill token + 1 ms per decoded sequence; no attention/context terms.
MODEL = StepTimeModel(coefficients=(1e-3, 1e-5, 0.0, 1e-3, 0.0), num_samples=100, mean_abs_pct_error=0.0)


def perf(worker_id="w", *, running=0, waiting=0, queued=0, remaining=(), context=0, model=MODEL, chunk=512) -> WorkerPerf:
    return WorkerPerf(
        worker_id=WorkerId(worker_id), model=model, chunk_tokens=chunk, block_size=16, num_running=running,
        num_waiting=waiting, num_queued_prefill_tokens=queued, running_remaining_tokens=tuple(remaining),
        running_context_tokens=context,
    )  # fmt: skip


def test_local_prediction_on_an_idle_worker():
    p = predict(prompt_tokens=1000, max_tokens=10, prefill_cached_tokens=0, prefill=perf(), decode=perf())
    # Two chunks (512 + 488 tokens): 2 ms of step overhead + 10 ms of tokens.
    assert p.queue_s == 0
    assert p.prefill_s == pytest.approx(0.002 + 0.010)
    assert p.ttft_s == pytest.approx(0.012)
    assert p.decode_batch == 1
    assert p.tpot_s == pytest.approx(0.001 + 0.001)


def test_queue_and_running_decodes_add_to_ttft():
    busy = perf(running=4, queued=512)
    p = predict(prompt_tokens=512, max_tokens=10, prefill_cached_tokens=256, prefill=busy, decode=busy)
    step_overhead = 0.001 + 4 * 0.001  # every step also decodes the 4 running sequences
    # First the rest of the step in flight (half a step of the running batch, on average).
    assert p.queue_s == pytest.approx(step_overhead / 2 + step_overhead + 512 * 1e-5)
    assert p.prefill_s == pytest.approx(step_overhead + 256 * 1e-5)


def test_disaggregated_prediction_adds_transfer_and_the_tail_step():
    p = predict(
        prompt_tokens=100, max_tokens=10, prefill_cached_tokens=0, prefill=perf("p"), decode=perf("d"),
        transfer_bytes=2_000_000, link_bytes_per_s=1e9,
    )  # fmt: skip
    assert p.transfer_s == pytest.approx(0.002)
    tail = 100 - 96  # the partial last block is computed on the decode worker
    assert p.ttft_s == pytest.approx((0.001 + 100e-5) + 0.002 + (0.001 + tail * 1e-5))


def test_a_disaggregated_request_waits_for_what_outlasts_its_prefill_in_the_decode_workers_queue():
    """It keeps its place in the decode worker's queue while its KV comes (queued_since), so of
    what was queued there it waits only for what is still running when its KV is in."""
    args = dict(
        prompt_tokens=100, max_tokens=10, prefill_cached_tokens=0, prefill=perf("p"), transfer_bytes=2_000_000, link_bytes_per_s=1e9
    )
    tail_step = 0.001 + 4 * 1e-5
    idle = predict(decode=perf("d"), **args)
    assert idle.ttft_s == pytest.approx((0.001 + 100e-5) + 0.002 + tail_step)
    # 512 tokens queued: half a step in flight (0.5 ms) + one step (1 + 5.12 ms) = 6.62 ms, longer
    # than the 4 ms of prefill and transfer: the tail's step follows it.
    busy = predict(decode=perf("d", queued=512), **args)
    assert busy.ttft_s == pytest.approx(0.0005 + 0.001 + 512e-5 + tail_step)
    # 50 queued (0.5 + 1.5 ms) drain before the KV is in: the step in flight then (half of 1 ms) and the tail's.
    assert predict(decode=perf("d", queued=50), **args).ttft_s == pytest.approx(0.004 + 0.0005 + tail_step)


def test_the_tails_step_carries_a_chunk_with_the_chance_the_decode_worker_is_prefilling():
    """inflow.py: prefill arriving at the decode worker on top of what is queued there."""
    args = dict(prompt_tokens=100, max_tokens=10, prefill_cached_tokens=0, prefill=perf("p"))
    chunk_work = 512 * 1e-5  # a full chunk's compute
    idle = predict(decode=perf("d"), **args)
    prefilling = dataclasses.replace(perf("d"), prefill_inflow=0.5, inflow_per_work_s=0.5)
    # The KV comes in during a prefill step half the time (half a chunk left, on average), and the
    # tail's own step carries a chunk half the time.
    assert predict(decode=prefilling, **args).ttft_s == pytest.approx(idle.ttft_s + 0.5 * chunk_work / 2 + 0.5 * chunk_work)
    # The same rate while 50 ms of that work is still queued there: 0.5 - 0.05 x 0.5 arrives on top
    # of it (the queue itself is waited out in full: 61 steps' overheads and 50 ms of tokens).
    queued = dataclasses.replace(perf("d", queued=5000), prefill_inflow=0.5, inflow_per_work_s=0.5)
    queue_s = 0.0005 + 10 * 0.001 + 5000e-5
    assert predict(decode=queued, **args).ttft_s == pytest.approx(queue_s + 0.001 + 4e-5 + 0.475 * chunk_work)


def test_tpot_counts_requests_that_finish_before_the_kv_arrives():
    # Three running: one finishes within the predicted TTFT, two remain; one waiting joins.
    decode = perf(running=3, waiting=1, remaining=(1, 500, 500), context=300)
    p = predict(prompt_tokens=16, max_tokens=4, prefill_cached_tokens=0, prefill=decode, decode=decode)
    assert p.decode_batch == 2 + 1 + 1
    assert p.tpot_s == pytest.approx(0.001 + 4 * 0.001)


def test_no_model_means_no_prediction():
    assert predict(prompt_tokens=10, max_tokens=1, prefill_cached_tokens=0, prefill=perf(model=None), decode=perf()) is None


def test_tpot_recovery_waits_for_enough_requests_to_finish():
    decode = perf(running=3, remaining=(10, 20, 30), context=30)
    # batch 4 -> 5 ms; needs batch <= 2 (3 ms) for a 3 ms objective: two must finish.
    step_now = 0.001 + 3 * 0.001
    assert tpot_recovery_s(decode, 0.003, 16, 4) == pytest.approx(20 * step_now)
    assert tpot_recovery_s(decode, 0.0015, 16, 4) is None


def test_tpot_recovery_waits_until_the_tpot_meets_its_objective_with_its_spread():
    """The retry-after of a TPOT rejection waits for what admission holds, the 95 % point: on a
    worker with half its time prefill (steps of 1 + batch ms take twice that), a 7.5 ms objective
    is met on average with 2 of 3 running requests gone (6 ms), with its spread (+2.1 ms: up to
    the step + a 5.12 ms chunk) only with all 3 gone (4 ms + 3.1)."""
    decode = dataclasses.replace(perf(running=3, remaining=(10, 20, 30), context=30), prefill_inflow=0.5, spread_work_s=0.004)
    step_now = (0.001 + 3 * 0.001) / 0.5
    assert tpot_recovery_s(decode, 0.0075, 16, 4) == pytest.approx(30 * step_now)
    alike = dataclasses.replace(decode, spread_work_s=0.0)  # no spread: the mean alone
    assert tpot_recovery_s(alike, 0.0075, 16, 4) == pytest.approx(20 * step_now)


def test_blocks_to_transfer_counts_full_blocks_not_held():
    assert blocks_to_transfer(100, 16, 0) == 6
    assert blocks_to_transfer(100, 16, 4) == 2
    assert blocks_to_transfer(10, 16, 0) == 0


def test_a_remote_tails_ttft_spread_is_the_chance_its_step_carries_a_chunk():
    """The KV lands during a step that carries a chunk of prefill, and its tail's own step carries
    one, with the chance the decode worker is prefilling (its inflow), else neither: half a chunk
    and a chunk more or nothing, so the TTFT's standard deviation is sqrt(p (1 - p)) x 1.5 chunks."""
    args = dict(prompt_tokens=100, max_tokens=10, prefill_cached_tokens=0, prefill=perf("p"))
    chunk_work = 512 * 1e-5
    prefilling = dataclasses.replace(perf("d"), prefill_inflow=0.2, inflow_per_work_s=0.5)
    p = predict(decode=prefilling, **args)
    assert p.ttft_spread_s == pytest.approx((0.2 * 0.8) ** 0.5 * 1.5 * chunk_work)
    assert p.ttft_high_ms == pytest.approx((p.ttft_s + TPOT_Z * p.ttft_spread_s) * 1000)
    # Always prefilling, never, or prefilled where it decodes: nothing uncertain in that step.
    always = dataclasses.replace(perf("d"), prefill_inflow=1.5, inflow_per_work_s=0.5)
    assert predict(decode=always, **args).ttft_spread_s == 0.0
    assert predict(decode=perf("d"), **args).ttft_spread_s == 0.0
    assert predict(prompt_tokens=100, max_tokens=10, prefill_cached_tokens=0, prefill=prefilling, decode=prefilling).ttft_spread_s == 0.0


def _request() -> RouteRequest:
    return RouteRequest(model="m", prompt_token_ids=[1] * 100, max_tokens=10, disagg=DisaggMode.AUTO)


def _option(worker: str, ttft_s: float, tpot_s: float, recovery: float | None = None) -> PlacementOption:
    return PlacementOption(WorkerId(worker), WorkerId(worker), Prediction(ttft_s, tpot_s, 0, ttft_s, 0, 1), recovery)


def test_predictive_admits_the_first_option_meeting_both_objectives():
    policy = make_admission_policy("predictive", AdmissionConfig())
    options = [_option("a", 3.0, 0.01), _option("b", 0.5, 0.5), _option("c", 0.5, 0.05)]
    verdict = policy.decide(_request(), [], options, Objective(ttft_ms=1000, tpot_ms=100))
    assert verdict == Admit(options[2])


def test_predictive_rejects_with_the_closest_miss_and_a_retry_after():
    policy = make_admission_policy("predictive", AdmissionConfig())
    objective = Objective(ttft_ms=1000, tpot_ms=100)
    verdict = policy.decide(_request(), [], [_option("a", 3.0, 0.01), _option("b", 1.5, 0.01)], objective)
    assert verdict == Reject(
        "objective=ttft predicted_ms=1500 target_ms=1000 decode_worker=b prefill_worker=b",
        retry_after_s=pytest.approx(0.5),
        kind=RejectKind.TTFT,
    )
    verdict = policy.decide(_request(), [], [_option("a", 0.1, 0.25, recovery=4.0)], objective)
    assert isinstance(verdict, Reject) and verdict.reason.startswith("objective=tpot predicted_ms=250 target_ms=100")
    assert verdict.retry_after_s == 4.0 and verdict.kind is RejectKind.TPOT


def test_predictive_holds_the_tpot_to_its_objective_with_confidence_not_on_average():
    """A placement whose mean TPOT meets the objective but whose spread (a short answer on a
    worker taking much prefill) puts its 95 % point past it is passed over for one that meets it
    with confidence; with none such, the rejection names the 95 % point."""
    policy = make_admission_policy("predictive", AdmissionConfig())
    objective = Objective(ttft_ms=1000, tpot_ms=100)
    spread = dataclasses.replace(_option("a", 0.1, 0.080), prediction=Prediction(0.1, 0.080, 0, 0.1, 0, 1, tpot_spread_s=0.020))
    assert spread.prediction.tpot_high_ms == pytest.approx(80 + TPOT_Z * 20) and TPOT_Z == pytest.approx(1.645, abs=1e-3)
    steady = _option("b", 0.3, 0.095)
    assert policy.decide(_request(), [], [spread, steady], objective) == Admit(steady)
    verdict = policy.decide(_request(), [], [spread], objective)
    assert isinstance(verdict, Reject) and verdict.kind is RejectKind.TPOT
    assert verdict.reason.startswith("objective=tpot predicted_ms=112.9 target_ms=100")


def test_predictive_holds_the_ttft_to_its_objective_with_confidence_not_on_average():
    """A remote placement whose mean TTFT meets the objective but whose tail step may carry a
    chunk of the decode worker's prefill (ttft_spread_s) past it is passed over for one that
    meets it with confidence; with none such, the rejection names the 95 % point."""
    policy = make_admission_policy("predictive", AdmissionConfig())
    objective = Objective(ttft_ms=1000, tpot_ms=100)
    spread = dataclasses.replace(_option("a", 0.9, 0.01), prediction=Prediction(0.9, 0.01, 0, 0.9, 0, 1, ttft_spread_s=0.2))
    steady = _option("b", 0.95, 0.01)
    assert policy.decide(_request(), [], [spread, steady], objective) == Admit(steady)
    verdict = policy.decide(_request(), [], [spread], objective)
    assert isinstance(verdict, Reject) and verdict.kind is RejectKind.TTFT
    assert verdict.reason.startswith(f"objective=ttft predicted_ms={900 + TPOT_Z * 200:.4g} target_ms=1000")
    assert verdict.retry_after_s == pytest.approx((0.9 + TPOT_Z * 0.2) - 1.0)


def test_a_predictions_tpot_spread_comes_from_its_decode_workers_inflow():
    """predictor.tpot_spread_seconds over the request's own output tokens, at the decode worker's
    inflow and the spread of the prompts arriving there; none on a worker taking no prefill."""
    busy = dataclasses.replace(perf(), prefill_inflow=0.5, spread_work_s=0.004)
    p = predict(prompt_tokens=100, max_tokens=11, prefill_cached_tokens=0, prefill=busy, decode=busy)
    chunk_s = 512 * 1e-5
    assert p.tpot_s == pytest.approx(0.002 / 0.5)
    assert p.tpot_spread_s == pytest.approx(tpot_spread_seconds(p.tpot_s, 0.5, 0.004, 10, 0.002 + chunk_s))
    assert p.tpot_spread_s == pytest.approx(min((0.5 * 0.004 * 0.004 / 10) ** 0.5 / 0.5, (0.002 + chunk_s - 0.004) / TPOT_Z))
    quiet = predict(prompt_tokens=100, max_tokens=11, prefill_cached_tokens=0, prefill=perf(), decode=perf())
    assert quiet.tpot_spread_s == 0.0 and quiet.tpot_high_ms == quiet.tpot_ms


def test_predictive_admits_when_no_model_exists_yet():
    policy = make_admission_policy("predictive", AdmissionConfig())
    option = PlacementOption(WorkerId("a"), WorkerId("a"), None)
    assert policy.decide(_request(), [], [option], Objective(1, 1)) == Admit(option)


def test_settings_validate_and_resolve_most_specific_first():
    validate_setting("admission.policy", "predictive")
    validate_setting("objectives.*.batch.tpot_ms", "250")
    for key, value, words in [
        ("admission.policy", "fifo", "must be one of"),
        ("objectives.m.urgent.ttft_ms", "5", "priority must be one of"),
        ("objectives.m.interactive.e2e_ms", "5", "objective must be one of"),
        ("objectives.m.interactive.ttft_ms", "-1", "finite number of milliseconds in"),
        ("objectives.m.interactive.ttft_ms", "inf", "finite number of milliseconds in"),
        ("objectives.m.interactive.ttft_ms", "3600001", "finite number of milliseconds in"),
        ("objectives.m.interactive.ttft_ms", "soon", "number of milliseconds"),
        ("router.temperature", "1", "unknown setting"),
    ]:
        with pytest.raises(SettingError, match=words):
            validate_setting(key, value)
    settings = ClusterSettings({
        "objectives.*.interactive.ttft_ms": "900",
        "objectives.m.interactive.ttft_ms": "300",
        "admission.policy": "predictive",
    })  # fmt: skip
    assert settings.objective("m", "interactive") == Objective(300.0, DEFAULT_OBJECTIVES["interactive"].tpot_ms)
    assert settings.objective("other", "interactive").ttft_ms == 900.0
    assert settings.objective("m", "batch") == DEFAULT_OBJECTIVES["batch"]
    assert settings.admission_policy("threshold") == "predictive"


def test_a_full_decode_batch_waits_for_the_earliest_finish():
    full = perf("d", running=2, remaining=(30, 10), context=40)
    full = WorkerPerf(**{**{f: getattr(full, f) for f in full.__slots__}, "max_num_seqs": 2})
    p = predict(prompt_tokens=16, max_tokens=4, prefill_cached_tokens=0, prefill=perf("p"), decode=full)
    step = 0.001 + 2 * 0.001
    assert p.room_wait_s == pytest.approx(10 * step)
    assert p.ttft_s >= p.room_wait_s


def test_a_decode_pool_without_room_for_the_request_waits_for_finishes_to_free_blocks():
    """Blocks are reserved at admission (prompt + max_tokens): 4 running requests hold 100 blocks
    each, 50 are free, and a 1,600-token prompt with 320 tokens to go needs 120, so one request
    must finish (the earliest, 10 tokens from now); one more waiting ahead needs a second."""
    base = perf("d", running=4, remaining=(40, 10, 30, 20), context=400)
    full = dataclasses.replace(base, num_used_blocks=400, num_free_blocks=50)
    step = 0.001 + 4 * 0.001
    p = predict(prompt_tokens=1600, max_tokens=320, prefill_cached_tokens=0, prefill=perf("p"), decode=full)
    assert p.room_wait_s == pytest.approx(10 * step)
    assert p.ttft_s >= p.room_wait_s
    behind = predict(prompt_tokens=1600, max_tokens=320, prefill_cached_tokens=0, prefill=perf("p"),
                     decode=dataclasses.replace(full, num_waiting=1))  # fmt: skip
    assert behind.room_wait_s == pytest.approx(20 * step)
    # Room for it: no wait; nor where the blocks in use are not known (0 used).
    roomy = dataclasses.replace(full, num_free_blocks=120)
    assert predict(prompt_tokens=1600, max_tokens=320, prefill_cached_tokens=0, prefill=perf("p"), decode=roomy).room_wait_s == 0
    unknown = dataclasses.replace(full, num_used_blocks=0)
    assert predict(prompt_tokens=1600, max_tokens=320, prefill_cached_tokens=0, prefill=perf("p"), decode=unknown).room_wait_s == 0
    # Prefilled where it decodes, the wait queues it there, less the blocks it finds cached.
    local = predict(prompt_tokens=1600, max_tokens=320, prefill_cached_tokens=0, prefill=full, decode=full)
    assert local.queue_s == pytest.approx(step / 2 + 10 * step)
    cached = predict(prompt_tokens=1600, max_tokens=320, prefill_cached_tokens=70 * 16, prefill=full, decode=full)
    assert cached.queue_s == pytest.approx(step / 2)  # 50 blocks to reserve: they are free


def test_a_remote_prefills_wait_for_decode_blocks_starts_when_its_prefill_ends():
    """The pull asks for blocks once the prompt is prefilled; blocks freed before then go to
    requests already asking: the decode worker's wait for room (10 steps, 50 ms) follows the
    prefill path (20 ms) instead of overlapping it."""
    base = perf("d", running=4, remaining=(40, 10, 30, 20), context=400)
    full = dataclasses.replace(base, num_used_blocks=400, num_free_blocks=50)
    roomy = dataclasses.replace(full, num_free_blocks=120)
    waits = predict(prompt_tokens=1600, max_tokens=320, prefill_cached_tokens=0, prefill=perf("p"), decode=full)
    free = predict(prompt_tokens=1600, max_tokens=320, prefill_cached_tokens=0, prefill=perf("p"), decode=roomy)
    assert waits.room_wait_s > 0 and free.room_wait_s == 0
    assert waits.ttft_s == pytest.approx(free.ttft_s + waits.room_wait_s)


def test_calibration_learns_the_residual_per_kind():
    calibration = Calibration(weight=0.5, half_life_s=10.0)
    raw = predict(prompt_tokens=100, max_tokens=4, prefill_cached_tokens=0, prefill=perf(), decode=perf())
    calibration.observe("local", raw.ttft_s, raw.ttft_s + 0.010, now=0.0)  # first observation is taken whole
    calibration.observe("local", raw.ttft_s, raw.ttft_s + 0.020, now=0.0)  # then an exponential mean
    assert calibration.offset("local", now=0.0) == pytest.approx(0.015)
    assert calibration.offset("disagg", now=0.0) == 0.0
    adjusted = calibration.apply(raw, "local", "tpot", now=0.0)
    assert adjusted.ttft_s == pytest.approx(raw.ttft_s + 0.015) and adjusted.ttft_offset_s == pytest.approx(0.015)
    assert adjusted.tpot_s == raw.tpot_s
    # One half-life without observations.
    assert calibration.offset("local", now=10.0) == pytest.approx(0.0075)


def test_a_kind_on_a_base_kind_is_offset_by_the_base_plus_its_own_extra():
    calibration = Calibration(weight=0.5, half_life_s=10.0, bases={"remote": "local"})
    calibration.observe("local", 0.001, 0.051, now=0.0)  # local requests 50 ms slower than modelled
    # No remote request measured yet: it misses at least what a local one misses.
    assert calibration.offset("remote", now=0.0) == pytest.approx(0.050)
    calibration.observe("remote", 0.002, 0.062, now=0.0)  # 60 ms over its model: 10 ms beyond local
    assert calibration.offset("remote", now=0.0) == pytest.approx(0.060)
    assert calibration.offset("local", now=0.0) == pytest.approx(0.050)
    calibration.observe("local", 0.001, 0.001, now=0.0)  # local calibrates back: 25 ms
    assert calibration.offset("remote", now=0.0) == pytest.approx(0.035)
    assert calibration.offset("remote", now=10.0) == pytest.approx(0.0175)  # both fade


def test_link_rate_is_an_ewma_of_measured_transfers():
    link = LinkRate(initial_bytes_per_s=1e9, weight=0.25)
    link.observe(0, 0.0)  # nothing moved: nothing learnt
    assert link.rate() == 1e9
    link.observe(2_000_000, 0.001)  # 2 GB/s measured: 1e9 + 0.25 x (2e9 - 1e9)
    assert link.rate() == pytest.approx(1.25e9)
    assert link.rate(stated_bytes_per_s=50e9) == pytest.approx(1.25e9)  # measured beats stated


def test_until_a_transfer_is_measured_the_link_is_the_given_rate_else_the_workers_stated_one():
    """A fleet that only prefills locally never measures a transfer: without the workers' stated
    rate it would price every prefix fetch at 1 GB/s forever (on 400 GbE, 50x too slow)."""
    assert LinkRate().rate() == LinkRate.DEFAULT_BYTES_PER_S
    assert LinkRate().rate(stated_bytes_per_s=50e9) == 50e9
    assert LinkRate(initial_bytes_per_s=5e9).rate(stated_bytes_per_s=50e9) == 5e9  # the operator's flag wins
    link = LinkRate(weight=0.5)
    link.observe(10_000_000, 0.001, stated_bytes_per_s=50e9)  # 10 GB/s measured, from the stated 50
    assert link.rate(stated_bytes_per_s=50e9) == pytest.approx(30e9)


def test_slot_wait_counts_whole_rounds_for_long_queues():
    full = WorkerPerf(**{**{f: getattr(perf(), f) for f in WorkerPerf.__slots__},
                         "num_running": 2, "num_waiting": 3, "running_remaining_tokens": (10, 30), "max_num_seqs": 2})  # fmt: skip
    p = predict(prompt_tokens=16, max_tokens=4, prefill_cached_tokens=0, prefill=full, decode=full)
    step = 0.001 + 2 * 0.001
    # Three ahead of us on two slots: one whole round (mean 20 tokens) plus the second finish (30).
    assert p.room_wait_s == 0.0  # local placement: the wait is queueing on the same worker
    assert p.queue_s == pytest.approx(step / 2 + (30 + 20) * step)  # after the rest of the step in flight
