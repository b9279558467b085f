"""Routing respects the KV transports workers serve: a remote prefill needs one the decode worker
shares; a fetch needs a shared kvplane transport (an engine's own connector cannot serve one)."""

from __future__ import annotations

import dataclasses

import pytest

from kvplane.controlplane.core.routing import NoCandidateError
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
    # kvplane in auto: d with 2,000 tokens queued prefills locally in 102 ms (at the fallback 20,000
    # tokens/s); remote, idle p1 would take 2 ms, but its KV cannot reach d: p2 waits for its 500
    # queued tokens (25 ms), prefills 40 (2 ms), and d computes the 4-token tail (0.2 ms).
    busy = with_transports(worker_view("d", num_queued_prefill_tokens=2000), "engine:sglang-mooncake")
    d = make_router().route(route_request(PROMPT_40, disagg=DisaggMode.AUTO), [busy, other_kind, same_kind], index, NOW)
    assert (d.decode_worker, d.prefill_worker) == ("d", "p2")
    assert d.reason.startswith("d: remote prefill on p2: TTFT 27.2 ms = max(queue 25.0, move 0.0) + prefill 2.0 + transfer 0.2")
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
