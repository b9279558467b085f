"""Admission policies: registry, config validation, `none`, and `threshold` limits and retry-after."""

from __future__ import annotations

import pytest

from kvplane.controlplane.core.admission import admission_policy_names, make_admission_policy
from kvplane.controlplane.core.admission_base import AdmissionConfig, Admit, Reject, RejectKind
from kvplane.controlplane.core.admission_none import AdmitAll
from kvplane.controlplane.core.admission_predictive import PredictiveAdmission
from kvplane.controlplane.core.admission_threshold import ThresholdAdmission

PROMPT = list(range(16))


def threshold(**kwargs) -> ThresholdAdmission:
    policy = make_admission_policy("threshold", AdmissionConfig(**kwargs))
    assert isinstance(policy, ThresholdAdmission)
    return policy


# -- registry and config -----------------------------------------------------------------------


def test_registry_builds_each_named_policy():
    built = {name: type(make_admission_policy(name, AdmissionConfig())) for name in admission_policy_names()}
    assert built == {"none": AdmitAll, "predictive": PredictiveAdmission, "threshold": ThresholdAdmission}
    with pytest.raises(ValueError, match=r"admission policy 'fifo' is unknown; choose one of \['none', 'predictive', 'threshold'\]"):
        make_admission_policy("fifo", AdmissionConfig())


def test_reject_kind_labels_are_bounded_and_sorted():
    assert (RejectKind.RUNNING | RejectKind.KV_USE).label == "kv_use+running"
    assert RejectKind.QUEUED_PREFILL_TOKENS.label == "queued_prefill_tokens"
    assert RejectKind(0).label == "other"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(max_running=0), r"AdmissionConfig.max_running must be an integer >= 1, got 0"),
        (dict(max_waiting=2.5), r"AdmissionConfig.max_waiting must be an integer >= 1, got 2.5"),
        (dict(max_queued_prefill_tokens=True), r"AdmissionConfig.max_queued_prefill_tokens must be an integer >= 1"),
        (dict(max_kv_usage=0.0), r"AdmissionConfig.max_kv_usage must be in \(0, 1\], got 0.0"),
        (dict(max_kv_usage=1.5), r"AdmissionConfig.max_kv_usage must be in \(0, 1\], got 1.5"),
        (dict(retry_after_s=0.0), r"AdmissionConfig.retry_after_s must be > 0"),
        (dict(retry_after_s=60.0), r"retry_after_s must be > 0 and <= max_retry_after_s \(30.0\), got 60.0"),
    ],
)
def test_invalid_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdmissionConfig(**kwargs)


# -- none --------------------------------------------------------------------------------------


def test_none_admits_even_an_overloaded_fleet(worker_view, route_request):
    policy = make_admission_policy("none", AdmissionConfig())
    overloaded = [worker_view("w1", num_running=10**6, num_used_blocks=100)]
    assert policy.decide(route_request(PROMPT), overloaded) == Admit()
    assert policy.decide(route_request(PROMPT), []) == Admit()


# -- threshold ---------------------------------------------------------------------------------


def test_threshold_admits_when_one_candidate_has_room(worker_view, route_request):
    candidates = [worker_view("w1", num_running=65), worker_view("w2", num_waiting=10)]
    assert threshold().decide(route_request(PROMPT), candidates) == Admit()


def test_threshold_limits_are_exceeded_only_strictly_above(worker_view, route_request):
    at_every_limit = worker_view(
        "w1", num_running=64, num_waiting=32, num_queued_prefill_tokens=32768, num_used_blocks=95, num_total_blocks=100
    )
    assert threshold().decide(route_request(PROMPT), [at_every_limit]) == Admit()


def test_threshold_rejects_when_every_candidate_is_over_and_names_the_limits(worker_view, route_request):
    candidates = [
        worker_view("w2", num_waiting=48, num_used_blocks=99, num_total_blocks=100),
        worker_view("w1", num_running=80),
    ]
    # w1 is 0.25 over (80 vs 64); w2 is 0.5 over at worst (48 vs 32); the least over decides:
    # retry = 1.0 * (1 + 0.25)
    assert threshold().decide(route_request(PROMPT), candidates) == Reject(
        reason="all 2 candidates over limits: w1 (running 80>64); w2 (waiting 48>32, kv use 0.99>0.95)",
        retry_after_s=1.25,
        kind=RejectKind.RUNNING | RejectKind.WAITING | RejectKind.KV_USE,
    )


def test_threshold_counts_queued_prefill_tokens(worker_view, route_request):
    decision = threshold(max_queued_prefill_tokens=1000, retry_after_s=2.0).decide(
        route_request(PROMPT), [worker_view("w1", num_queued_prefill_tokens=1500)]
    )
    assert decision == Reject(
        reason="all 1 candidates over limits: w1 (queued prefill tokens 1500>1000)",
        retry_after_s=3.0,
        kind=RejectKind.QUEUED_PREFILL_TOKENS,
    )


def test_threshold_retry_after_is_capped(worker_view, route_request):
    decision = threshold().decide(route_request(PROMPT), [worker_view("w1", num_running=6400)])
    assert isinstance(decision, Reject)
    assert decision.retry_after_s == 30.0  # 1.0 * (1 + 99) capped at max_retry_after_s
    capped_lower = threshold(max_retry_after_s=5.0).decide(route_request(PROMPT), [worker_view("w1", num_running=6400)])
    assert isinstance(capped_lower, Reject) and capped_lower.retry_after_s == 5.0


def test_threshold_treats_an_unreported_block_pool_as_empty(worker_view, route_request):
    unreported = worker_view("w1", num_used_blocks=0, num_total_blocks=0)
    assert threshold().decide(route_request(PROMPT), [unreported]) == Admit()


def test_threshold_rejects_when_there_is_no_candidate(route_request):
    assert threshold(retry_after_s=0.5).decide(route_request(PROMPT), []) == Reject(
        reason="no candidate worker for model 'm' to admit onto", retry_after_s=0.5, kind=RejectKind.NO_CANDIDATE
    )


def test_threshold_reason_stays_short_for_a_large_fleet(worker_view, route_request):
    candidates = [worker_view(f"w{i}", num_running=65) for i in range(6)]
    decision = threshold().decide(route_request(PROMPT), candidates)
    assert isinstance(decision, Reject)
    assert decision.reason == (
        "all 6 candidates over limits: w0 (running 65>64); w1 (running 65>64); w2 (running 65>64); w3 (running 65>64); +2 more"
    )
    assert decision.retry_after_s == pytest.approx(1 + 1 / 64)


def test_threshold_overshoots_lists_limits_in_fixed_order(worker_view):
    worker = worker_view("w1", num_running=70, num_waiting=40, num_queued_prefill_tokens=40000, num_used_blocks=100)
    assert [str(o) for o in threshold().overshoots(worker)] == [
        "running 70>64",
        "waiting 40>32",
        "queued prefill tokens 40000>32768",
        "kv use 1>0.95",
    ]
    assert threshold().overshoots(worker_view("w2")) == []
