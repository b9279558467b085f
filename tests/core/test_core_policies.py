"""Routing policies: the kvplane policy's hot-prefix handling, predicted prefixes and fetch
decision, in predicted seconds; and the three baselines. Fleet defaults (conftest): model "m",
block size 4, 100-block workers. Workers publish no step-time model unless a test gives one, so
the kvplane policy's seconds come from its fallback: `prefill_tokens_per_s` (20,000 by default)
per prefill token, no per-step or decode terms."""

from __future__ import annotations

import dataclasses

import pytest

from kvplane.block_hash import hash_blocks
from kvplane.controlplane.core.cost import CostConfig
from kvplane.controlplane.core.index import StoredEvent
from kvplane.controlplane.core.policies import make_routing_policy, params_type, routing_policy_names
from kvplane.controlplane.core.router import RouterConfig
from kvplane.latency import StepTimeModel
from kvplane.types import DisaggMode, Tier, WorkerId
from tests.core.conftest import make_router

PROMPT_40 = list(range(200, 240))  # 10 full blocks; at most 9 count as cached (the last token is computed)
NOW = 100.0
TOKEN_S = 1 / 20000
# 10 ms a step, 1 ms a prefill token, 2 ms a sequence in the batch.
MODEL = StepTimeModel((0.010, 0.001, 0.0, 0.002, 0.0), num_samples=10, mean_abs_pct_error=0.0)


def chosen_cost(decision, worker_id):
    return next(c for c in decision.candidates if c.worker_id == worker_id)


# The choice counts what a placement spends as well as its TTFT: hot spends its wait for `queued`
# tokens + 4 computed + those 4 again (the compute it adds); a and b 40 + 40.
@pytest.mark.parametrize(("queued", "holder_wins"), [(71, True), (73, False)])
def test_hot_prefix_holder_keeps_its_readers_until_its_queue_costs_more_than_twice_the_prefix_compute(
    index, cache_prefix, worker_view, route_request, queued, holder_wins
):
    cache_prefix("hot", PROMPT_40, 10)
    # hot: wait for `queued` tokens, then compute 4 (36 cached); a and b: compute all 40.
    workers = [worker_view("hot", num_queued_prefill_tokens=queued), worker_view("a"), worker_view("b")]
    decision = make_router().route(route_request(PROMPT_40), workers, index, NOW)
    assert (decision.decode_worker == "hot") is holder_wins
    assert chosen_cost(decision, "hot").cost == pytest.approx((queued + 4) * TOKEN_S, rel=1e-12)
    assert chosen_cost(decision, "a").cost == pytest.approx(40 * TOKEN_S, rel=1e-12)


def test_a_holder_running_too_many_requests_loses_its_readers(index, cache_prefix, worker_view, route_request):
    cache_prefix("hot", PROMPT_40, 10)
    # Every step carries the batch, and a request first waits for the rest of the step in flight
    # (half a step): on hot, 10 + 2 x 16 = 42 ms a step: 21 + 42 + 4 tokens = 67 ms; its 4 ms of
    # compute delay the next request and its 16 decodes, each ms of theirs worth 2000 / (200 x 16 /
    # 2) = 1.25 of a prompt's (the default objectives, seconds.batch_share_of): 67 + 4 x 21 = 151;
    # on a (one running request), 6 + 12 + 40 tokens = 58 ms + 40 x 2.25: 148. With 15 running,
    # hot's 20 + 40 + 4 = 64 ms + 4 x 19.75: 143 wins.
    others = [worker_view("a", num_running=1, latency=MODEL), worker_view("b", num_running=1, latency=MODEL)]
    busy = make_router().route(route_request(PROMPT_40), [worker_view("hot", num_running=16, latency=MODEL), *others], index, NOW)
    assert busy.decode_worker != "hot"
    assert (chosen_cost(busy, "hot").cost, busy.candidates[0].cost) == (pytest.approx(0.067), pytest.approx(0.058))
    calm = make_router().route(route_request(PROMPT_40), [worker_view("hot", num_running=15, latency=MODEL), *others], index, NOW)
    assert calm.decode_worker == "hot" and calm.candidates[0].cost == pytest.approx(0.064)


def test_miss_goes_to_the_least_loaded_not_the_emptiest_cache(index, cache_prefix, worker_view, route_request):
    cache_prefix("big-cache-idle", list(range(900, 940)), 10)  # a big, unrelated cache
    workers = [worker_view("empty-but-busy", num_queued_prefill_tokens=64), worker_view("big-cache-idle")]
    assert make_router().route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "big-cache-idle"
    assert make_router(policy="prefix-only").route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "empty-but-busy"


def test_routed_prefix_is_predicted_until_ttl_and_replaced_by_events(index, worker_view, route_request):
    router = make_router(prediction_ttl_s=2.0)
    workers = [worker_view(w, block_nbytes=10**6) for w in ("w1", "w2", "w3", "w4")]
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
    assert (chosen.cached_tokens, chosen.detail.move_s) == (36, 0.0)  # predicted blocks count as on the device
    # Its last block stored: the index holds the prompt, and only the index speaks.
    index.apply_batch(first.decode_worker, 1, [StoredEvent(tuple(hashes[3:]), Tier.HOST)])
    router.on_kv_stored(first.decode_worker, hashes[3:])
    d = router.route(route_request(PROMPT_40), workers, index, NOW)
    chosen = next(c for c in d.candidates if c.worker_id == first.decode_worker)
    # 10 host blocks, 9 of them used: loaded at 25 GB/s, 1 MB each.
    assert (chosen.cached_tokens, chosen.detail.move_s) == (36, pytest.approx(9 * 10**6 / 25e9, rel=1e-12))
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


def test_a_prefix_is_predicted_only_where_it_is_computed_not_where_its_kv_will_land(index, worker_view, route_request):
    # A reader sent to a decode worker before a remote prefill's KV (or a fetch) lands there
    # computes the prompt again, and holds the step the remote request's first token waits for.
    router = make_router(prediction_ttl_s=2.0)
    workers = [worker_view(w) for w in ("w1", "w2", "w3")]
    first = router.route(route_request(PROMPT_40), workers, index, NOW)
    router.record(dataclasses.replace(first, decode_worker="w1", prefill_worker="w2"), NOW)
    d = router.route(route_request(PROMPT_40 + [1]), workers, index, NOW)
    assert {c.worker_id: c.cached_tokens for c in d.candidates} == {"w1": 0, "w2": 40, "w3": 0}
    router.record(dataclasses.replace(first, decode_worker="w3", prefill_worker=None, fetch_from="w2", fetch_tokens=36), NOW)
    d = router.route(route_request(PROMPT_40 + [2]), workers, index, NOW)
    assert {c.worker_id: c.cached_tokens for c in d.candidates} == {"w1": 0, "w2": 40, "w3": 0}
    # Prefilled where it decodes: the next reader there queues behind the prompt and finds it.
    router.record(dataclasses.replace(first, decode_worker="w1", prefill_worker=None), NOW)
    d = router.route(route_request(PROMPT_40 + [3]), workers, index, NOW)
    assert {c.worker_id: c.cached_tokens for c in d.candidates}["w1"] == 40


def test_fetch_from_a_busy_holder_when_pull_beats_prefill(index, cache_prefix, worker_view, route_request):
    cache_prefix("holder", PROMPT_40, 10)
    workers = [worker_view("holder", num_queued_prefill_tokens=100, block_nbytes=8192), worker_view("idle", block_nbytes=8192)]
    request = route_request(PROMPT_40, disagg=DisaggMode.AUTO)
    slow_prefill = make_router(fetch_overhead_ms=1.0, prefill_tokens_per_s=1000.0)
    d = slow_prefill.route(request, workers, index, NOW, link_bytes_per_s=1e9)
    # holder: its queue (100 ms) then 4 tokens: 104 ms. idle: 40 tokens, 40 ms; or pull 9 blocks
    # (the last is always computed): 1 ms + 9 x 8192 B / 1 GB/s = 1.074 ms, then 4 tokens: 5.074 ms.
    pull = 0.001 + 9 * 8192 / 1e9
    assert (d.decode_worker, d.fetch_from, d.fetch_tokens, d.disaggregated) == ("idle", "holder", 36, False)
    assert (d.fetch_s, d.candidates[0].cost) == (pytest.approx(pull, rel=1e-12), pytest.approx(pull + 0.004, rel=1e-12))
    assert d.reason.startswith("idle: fetch 9 blocks from holder: TTFT 5.1 ms = max(queue 0.0, move 1.1) + prefill 4.0")
    # A fast prefill makes recomputing (40 us) cheaper than the pull: no fetch.
    d = make_router(fetch_overhead_ms=1.0, prefill_tokens_per_s=1e6).route(request, workers, index, NOW, link_bytes_per_s=1e9)
    assert (d.decode_worker, d.fetch_from) == ("idle", None)
    # "never" forbids moving KV.
    never = route_request(PROMPT_40, disagg=DisaggMode.NEVER)
    assert slow_prefill.route(never, workers, index, NOW, link_bytes_per_s=1e9).fetch_from is None
    # Blocks held on host only cannot be pinned without computing: nothing to pull.
    other = list(range(500, 540))
    cache_prefix("holder", other, 10, Tier.HOST)
    d = slow_prefill.route(route_request(other, disagg=DisaggMode.AUTO), workers, index, NOW, link_bytes_per_s=1e9)
    assert (d.decode_worker, d.fetch_from) == ("idle", None)


@pytest.mark.parametrize(("held", "fetched"), [(1, None), (2, "holder")])
def test_a_fetch_pays_only_when_the_pull_costs_less_than_the_prefill_it_saves(
    index, cache_prefix, worker_view, route_request, held, fetched
):
    cache_prefix("holder", PROMPT_40, held)
    workers = [worker_view("holder", num_queued_prefill_tokens=100, block_nbytes=8192), worker_view("idle", block_nbytes=8192)]
    router = make_router(fetch_overhead_ms=10.0, prefill_tokens_per_s=1000.0)
    d = router.route(route_request(PROMPT_40, disagg=DisaggMode.AUTO), workers, index, NOW, link_bytes_per_s=1e9)
    # A block saves 4 tokens of prefill: 4 ms of the TTFT and 4 ms of compute the next request
    # waits for; the pull costs 10 ms + 8.192 us a block: one block (TTFT 46.008 ms + 36 of compute
    # against 40 + 40) does not pay, two (42.016 + 32) do.
    assert (d.decode_worker, d.fetch_from) == ("idle", fetched)
    assert d.candidates[0].cost == pytest.approx(0.010 + held * 8192 / 1e9 + (40 - 4 * held) * 0.001 if fetched else 0.040, rel=1e-12)


def test_fetch_source_is_the_longest_holder_with_the_same_block_layout(index, cache_prefix, worker_view, route_request):
    cache_prefix("other-layout", PROMPT_40, 10)  # holds more, but its blocks have another size in bytes
    cache_prefix("holder", PROMPT_40, 6)
    cache_prefix("shorter", PROMPT_40, 5)
    workers = [
        worker_view("other-layout", num_queued_prefill_tokens=1000, block_nbytes=4096),
        worker_view("shorter", num_queued_prefill_tokens=1000, block_nbytes=8192),
        worker_view("holder", num_queued_prefill_tokens=1000, block_nbytes=8192),
        worker_view("idle", block_nbytes=8192),
    ]
    router = make_router(fetch_overhead_ms=1.0, prefill_tokens_per_s=1000.0)
    d = router.route(route_request(PROMPT_40, disagg=DisaggMode.AUTO), workers, index, NOW, link_bytes_per_s=1e9)
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
    with pytest.raises(ValueError, match="KvplaneParams.host_load_gb_per_s must be > 0"):
        make_router(host_load_gb_per_s=0.0)
    with pytest.raises(ValueError, match="KvplaneParams.fetch_overhead_ms must be >= 0"):
        make_router(fetch_overhead_ms=-1.0)
    with pytest.raises(ValueError, match="KvplaneParams.prefill_tokens_per_s must be a finite number"):
        make_router(prefill_tokens_per_s=float("inf"))


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
