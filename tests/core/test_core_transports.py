"""Routing respects the KV transports workers serve: a remote prefill needs one the decode worker
shares; a fetch needs a shared kvplane transport (an engine's own connector cannot serve one)."""

from __future__ import annotations

import dataclasses

import pytest

from kvplane.controlplane.core.routing import NoCandidateError
from kvplane.latency import StepTimeModel
from kvplane.types import DisaggMode, Role
from tests.core.conftest import make_router
from tests.core.test_core_policies import NOW, PROMPT_40


def with_transports(view, *names):
    return dataclasses.replace(view, transports=tuple(names))


def test_remote_prefill_only_with_a_shared_transport(index, worker_view, route_request):
    request = route_request(PROMPT_40, disagg=DisaggMode.ALWAYS)
    decode = with_transports(worker_view("d"), "engine:sglang-mooncake")
    other_kind = with_transports(worker_view("p1", Role.PREFILL), "engine:sglang-nixl")
    same_kind = with_transports(worker_view("p2", Role.PREFILL, num_queued_prefill_tokens=500), "engine:sglang-mooncake")
    for policy in ("kvplane", "least-load"):
        d = make_router(policy=policy).route(request, [decode, other_kind, same_kind], index, NOW)
        assert (d.decode_worker, d.prefill_worker) == ("d", "p2")  # p1 is idler but cannot hand its KV to d
    # kvplane in auto, steps of 8 prompt tokens (c0 10 ms, 1 ms a token, 2 ms a decoded sequence): d
    # decodes 40 requests, 90 ms steps, and prefills locally in half a step in flight + 5 x 90 + 40 =
    # 535 ms. Remote, idle p1 would take 5 x 10 + 40 = 90 ms, but its KV cannot reach d: p2 waits for
    # half its step in flight and its 100 queued tokens (5 + 13 x 10 + 100 = 235 ms), prefills 40
    # (90 ms); then d's half step in flight (45 ms) and its step computing the 4-token tail (90 + 4
    # ms): 464 ms.
    model = StepTimeModel((0.010, 0.001, 0.0, 0.002, 0.0), num_samples=10, mean_abs_pct_error=0.0)

    def chunked(view):
        return dataclasses.replace(view, latency=model, chunk_tokens=8)

    busy = chunked(with_transports(worker_view("d", num_running=40), "engine:sglang-mooncake"))
    p2 = chunked(with_transports(worker_view("p2", Role.PREFILL, num_queued_prefill_tokens=100), "engine:sglang-mooncake"))
    d = make_router().route(route_request(PROMPT_40, disagg=DisaggMode.AUTO), [busy, chunked(other_kind), p2], index, NOW)
    assert (d.decode_worker, d.prefill_worker) == ("d", "p2")
    assert d.reason.startswith("d: remote prefill on p2: TTFT 464.0 ms = max(queue 235.0, move 0.0) + prefill 90.0 + transfer 139.0")
    auto = route_request(PROMPT_40, disagg=DisaggMode.AUTO)
    d = make_router(disagg_threshold_tokens=0).route(auto, [decode, other_kind], index, NOW)
    assert d.prefill_worker is None and not d.disaggregated
    with pytest.raises(NoCandidateError, match="no active prefill worker"):
        make_router().route(request, [decode, other_kind], index, NOW)
    # A worker that states no transports (None) is assumed to share any.
    d = make_router().route(request, [decode, worker_view("p3", Role.PREFILL)], index, NOW)
    assert d.prefill_worker == "p3"


def test_no_fetch_through_an_engines_own_connector(index, cache_prefix, worker_view, route_request):
    cache_prefix("holder", PROMPT_40, 10)
    request = route_request(PROMPT_40, disagg=DisaggMode.AUTO)
    router = make_router(fetch_overhead_ms=1.0, prefill_tokens_per_s=1000.0)
    holder = worker_view("holder", num_queued_prefill_tokens=100, block_nbytes=8192)
    idle = worker_view("idle", block_nbytes=8192)
    native = [with_transports(holder, "engine:vllm-nixl"), with_transports(idle, "engine:vllm-nixl")]
    assert router.route(request, native, index, NOW).fetch_from is None
    kvplane = [with_transports(holder, "grpc", "engine:x"), with_transports(idle, "grpc")]
    assert router.route(request, kvplane, index, NOW).fetch_from == "holder"
    assert router.route(request, [with_transports(holder), with_transports(idle)], index, NOW).fetch_from is None


def test_candidates_of_two_transport_groups_each_explain_their_own_placement(index, worker_view, route_request):
    """Decode workers of two KV transports are priced as two groups, each with the prefill workers
    its KV can come from; merged, every candidate's note still names its own group's prefill worker
    (Priced.placed maps a merged position back to its group)."""
    request = route_request(PROMPT_40, disagg=DisaggMode.ALWAYS)
    fleet = [
        with_transports(worker_view("d-mooncake"), "engine:sglang-mooncake"),
        with_transports(worker_view("d-nixl", num_running=3), "engine:sglang-nixl"),
        with_transports(worker_view("p-mooncake", Role.PREFILL), "engine:sglang-mooncake"),
        with_transports(worker_view("p-nixl", Role.PREFILL, num_queued_prefill_tokens=50), "engine:sglang-nixl"),
    ]
    d = make_router().route(request, fleet, index, NOW)
    notes = {c.worker_id: c.note for c in d.candidates}
    assert notes.keys() == {"d-mooncake", "d-nixl"}
    assert notes["d-mooncake"].startswith("remote prefill on p-mooncake:"), notes
    assert notes["d-nixl"].startswith("remote prefill on p-nixl:"), notes
