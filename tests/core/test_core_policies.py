"""Routing policies: the kvplane policy's load guard, predicted prefixes and fetch decision, and
the three baselines. Fleet defaults (conftest): model "m", block size 4, 100-block workers."""

from __future__ import annotations

import dataclasses

import pytest

from kvplane.block_hash import hash_blocks
from kvplane.controlplane.core.cost import CostConfig
from kvplane.controlplane.core.index import StoredEvent
from kvplane.controlplane.core.policies import make_routing_policy, params_type, routing_policy_names
from kvplane.controlplane.core.policies.kvplane import guard_factor
from kvplane.controlplane.core.router import RouterConfig
from kvplane.types import DisaggMode, Tier, WorkerId
from tests.core.conftest import make_router

PROMPT_40 = list(range(200, 240))  # 10 full blocks
NOW = 100.0


def test_guard_factor_numbers():
    assert guard_factor(100, mean=100, ratio=1.5, slack=0, power=2) == 1.0
    assert guard_factor(300, mean=100, ratio=1.5, slack=0, power=2) == pytest.approx(0.25)
    assert guard_factor(300, mean=100, ratio=1.5, slack=150, power=2) == 1.0


def test_hot_prefix_holder_keeps_its_hit_until_its_queue_is_far_above_the_pool(index, cache_prefix, worker_view, route_request):
    cache_prefix("hot", PROMPT_40, 10)
    calm = [worker_view("hot", num_queued_prefill_tokens=4), worker_view("a"), worker_view("b")]
    assert make_router(guard_slack_tokens=4).route(route_request(PROMPT_40), calm, index, NOW).decode_worker == "hot"
    # 24 queued tokens against a pool mean of 8: allowed 1.5 x 8 + 4 = 16, credit x (16/24)^2 = 0.44:
    # hot costs 6 + 10 - 4.44 = 11.56 > 10 for an idle worker without the prefix.
    busy = [worker_view("hot", num_queued_prefill_tokens=24), worker_view("a"), worker_view("b")]
    decision = make_router(guard_slack_tokens=4).route(route_request(PROMPT_40), busy, index, NOW)
    assert decision.decode_worker != "hot"
    hot = next(c for c in decision.candidates if c.worker_id == "hot")
    assert "load guard x0.44" in hot.note and hot.cost == pytest.approx(6 + 10 - 10 * (16 / 24) ** 2)
    # Without the guard the hit outweighs the queue and every request would pile onto hot.
    assert make_router(guard_ratio=0).route(route_request(PROMPT_40), busy, index, NOW).decode_worker == "hot"


def test_guard_sends_a_hit_away_from_a_worker_with_too_many_requests(index, cache_prefix, worker_view, route_request):
    cache_prefix("hot", PROMPT_40, 10)
    # A long cached prefix (all 10 blocks) earns a credit that outweighs 7 more used blocks; 20 running
    # requests against a pool mean of 7.3 (allowed 1.5 x 7.3 + 4 = 15) shrink it to x0.56.
    workers = [
        worker_view("hot", num_running=20, num_used_blocks=8),
        worker_view("a", num_running=1, num_used_blocks=1),
        worker_view("b", num_running=1, num_used_blocks=1),
    ]
    assert make_router(guard_ratio=0).route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "hot"
    assert make_router().route(route_request(PROMPT_40), workers, index, NOW).decode_worker != "hot"


def test_miss_goes_to_the_least_loaded_not_the_emptiest_cache(index, cache_prefix, worker_view, route_request):
    cache_prefix("big-cache-idle", list(range(900, 940)), 10)  # a big, unrelated cache
    workers = [worker_view("empty-but-busy", num_queued_prefill_tokens=64), worker_view("big-cache-idle")]
    assert make_router().route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "big-cache-idle"
    assert make_router(policy="prefix-only").route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "empty-but-busy"


def test_routed_prefix_is_predicted_until_ttl_and_replaced_by_events(index, worker_view, route_request):
    router = make_router(prediction_ttl_s=2.0)
    workers = [worker_view(w) for w in ("w1", "w2", "w3", "w4")]
    first = router.route(route_request(PROMPT_40), workers, index, NOW)
    router.record(first, NOW)
    # The burst's next requests see the prefix on the first one's worker before any event.
    for i in range(5):
        d = router.route(route_request(PROMPT_40 + [i]), workers, index, NOW)
        assert d.decode_worker == first.decode_worker and d.cached_tokens == 40
        router.record(d, NOW)
    # Part of the prompt stored: the rest is still being computed, the prediction still speaks.
    hashes = hash_blocks(PROMPT_40, 4, "m")
    index.apply_batch(first.decode_worker, 0, [StoredEvent(tuple(hashes[:3]), Tier.HOST)])
    router.on_kv_stored(first.decode_worker, hashes[:3])
    d = router.route(route_request(PROMPT_40), workers, index, NOW)
    chosen = next(c for c in d.candidates if c.worker_id == first.decode_worker)
    assert "10 matched blocks (credit 10)" in chosen.note
    # Its last block stored: the index holds the prompt, and only the index speaks.
    index.apply_batch(first.decode_worker, 1, [StoredEvent(tuple(hashes[3:]), Tier.HOST)])
    router.on_kv_stored(first.decode_worker, hashes[3:])
    d = router.route(route_request(PROMPT_40), workers, index, NOW)
    chosen = next(c for c in d.candidates if c.worker_id == first.decode_worker)
    assert "10 matched blocks (credit 9)" in chosen.note  # 10 host blocks (0.9)
    # Without the stored events, the predictions expire after the TTL.
    other = workers[1] if first.decode_worker != "w2" else workers[2]
    router.record(dataclasses.replace(first, decode_worker=other.worker_id), NOW)
    d = router.route(route_request(PROMPT_40), workers, index, NOW + 1.0)
    assert next(c for c in d.candidates if c.worker_id == other.worker_id).cached_tokens == 36
    d = router.route(route_request(PROMPT_40), workers, index, NOW + 2.5)
    assert next(c for c in d.candidates if c.worker_id == other.worker_id).cached_tokens == 0


def test_route_queries_without_record_predict_nothing(index, worker_view, route_request):
    router = make_router()
    workers = [worker_view("w1"), worker_view("w2")]
    router.route(route_request(PROMPT_40), workers, index, NOW)
    assert all(c.cached_tokens == 0 for c in router.route(route_request(PROMPT_40), workers, index, NOW).candidates)


def test_fetch_from_a_busy_holder_when_pull_beats_prefill(index, cache_prefix, worker_view, route_request):
    cache_prefix("holder", PROMPT_40, 10)
    workers = [worker_view("holder", num_used_blocks=40, block_nbytes=8192), worker_view("idle", block_nbytes=8192)]
    request = route_request(PROMPT_40, disagg=DisaggMode.AUTO)
    # 9 blocks (the last is always computed): pull 1 + 9 x 8192 B / 1 GB/s = 1.07 ms, prefill 36 tokens at 1k/s = 36 ms.
    d = make_router(fetch_overhead_ms=1.0, fetch_bytes_per_s=1e9, prefill_tokens_per_s=1000.0).route(request, workers, index, NOW)
    assert (d.decode_worker, d.fetch_from, d.fetch_tokens, d.disaggregated) == ("idle", "holder", 36, False)
    assert d.reason.startswith("fetch: holder holds 36 more cached prefix tokens") and "1.1 ms < prefill 36.0 ms" in d.reason
    # A fast prefill makes recomputing cheaper than the pull: no fetch.
    d = make_router(fetch_overhead_ms=1.0, fetch_bytes_per_s=1e9, prefill_tokens_per_s=1e6).route(request, workers, index, NOW)
    assert d.fetch_from is None
    # Host blocks cannot be pinned without computing, "never" forbids moving KV, and 0 turns it off.
    assert make_router(fetch_min_blocks=0).route(request, workers, index, NOW).fetch_from is None
    never = route_request(PROMPT_40, disagg=DisaggMode.NEVER)
    assert make_router(prefill_tokens_per_s=1000.0).route(never, workers, index, NOW).fetch_from is None


def test_fetch_needs_fetch_min_blocks_more_than_the_chosen_worker_holds(index, cache_prefix, worker_view, route_request):
    """The boundary (the policy gives up before building any pool when no holder brings enough)."""
    fast_pull = {"fetch_overhead_ms": 1.0, "fetch_bytes_per_s": 1e9, "prefill_tokens_per_s": 1000.0, "fetch_min_blocks": 4}
    request = route_request(PROMPT_40, disagg=DisaggMode.AUTO)
    for held, fetched in ((3, None), (4, "holder")):
        cache_prefix("holder", PROMPT_40, held)
        workers = [worker_view("holder", num_used_blocks=40, block_nbytes=8192), worker_view("idle", block_nbytes=8192)]
        d = make_router(**fast_pull).route(request, workers, index, NOW)
        assert d.decode_worker == "idle" and d.fetch_from == fetched, (held, d.reason)


def test_fetch_source_is_the_longest_holder_with_the_same_block_layout(index, cache_prefix, worker_view, route_request):
    cache_prefix("other-layout", PROMPT_40, 10)  # holds more, but its blocks have another size in bytes
    cache_prefix("holder", PROMPT_40, 6)
    cache_prefix("shorter", PROMPT_40, 5)
    workers = [
        worker_view("other-layout", num_used_blocks=40, block_nbytes=4096),
        worker_view("shorter", num_used_blocks=40, block_nbytes=8192),
        worker_view("holder", num_used_blocks=40, block_nbytes=8192),
        worker_view("idle", block_nbytes=8192),
    ]
    router = make_router(fetch_overhead_ms=1.0, fetch_bytes_per_s=1e9, prefill_tokens_per_s=1000.0)
    d = router.route(route_request(PROMPT_40, disagg=DisaggMode.AUTO), workers, index, NOW)
    assert (d.decode_worker, d.fetch_from, d.fetch_tokens) == ("idle", "holder", 24)


def test_registry_builds_every_policy_from_its_params():
    for name in routing_policy_names():
        params = params_type(name)()
        assert params.name == name
        assert make_routing_policy(params, CostConfig()).costs  # type: ignore[truthy-function]
        assert RouterConfig(policy=params).policy_name == name
    with pytest.raises(ValueError, match="routing policy 'nope' is unknown; choose one of"):
        params_type("nope")
    with pytest.raises(ValueError, match="RouterConfig.policy must be the params of one of"):
        RouterConfig(policy="kvplane")  # type: ignore[arg-type]


def test_kvplane_params_are_validated():
    with pytest.raises(ValueError, match="KvplaneParams.guard_slack_tokens must be an integer"):
        make_router(guard_slack_tokens=1.5)
    with pytest.raises(ValueError, match="KvplaneParams.fetch_bytes_per_s must be > 0"):
        make_router(fetch_bytes_per_s=0.0)


def test_baseline_policies(index, cache_prefix, worker_view, route_request):
    cache_prefix("w2", PROMPT_40, 10)
    workers = [worker_view("w1"), worker_view("w2", num_used_blocks=50), worker_view("w3", num_used_blocks=10)]
    rr = make_router(policy="round-robin")
    picks = []
    for _ in range(4):
        d = rr.route(route_request(PROMPT_40), workers, index, NOW)
        rr.record(d, NOW)
        picks.append(d.decode_worker)
    assert picks == ["w1", "w2", "w3", "w1"]
    assert make_router(policy="least-load").route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "w1"
    assert make_router(policy="prefix-only").route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "w2"


def test_removed_worker_forgets_its_predictions(index, worker_view, route_request):
    router = make_router()
    workers = [worker_view("w1"), worker_view("w2")]
    d = router.route(route_request(PROMPT_40), workers, index, NOW)
    router.record(d, NOW)
    router.on_worker_removed(WorkerId(d.decode_worker))
    assert all(c.cached_tokens == 0 for c in router.route(route_request(PROMPT_40), workers, index, NOW).candidates)
