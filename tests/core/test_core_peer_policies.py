"""The peers' routing rules as policies (dynamo, sglang, llm-d), checked against hand-computed
costs and scores, and the approximate cache they keep from routing alone. Fleet defaults
(conftest): model "m", block size 4, 100-block workers."""

from __future__ import annotations

import pytest

from kvplane.block_hash import hash_blocks
from kvplane.controlplane.core.index import StoredEvent
from kvplane.controlplane.core.policies.routed_cache import RoutedCache
from kvplane.controlplane.core.router import RouterConfig
from kvplane.controlplane.flags import add_config_arguments, config_from_args
from kvplane.types import DisaggMode, Role, Tier, WorkerId
from tests.core.conftest import BLOCK_SIZE, MODEL, make_router

PROMPT_40 = list(range(200, 240))  # 10 full blocks
OTHER_40 = list(range(600, 640))
NOW = 100.0


def costs_of(decision) -> dict[str, float]:
    return {c.worker_id: c.cost for c in decision.candidates}


def routed(router, request, workers, index):
    d = router.route(request, workers, index, NOW)
    router.record(d, NOW)
    return d


# -- dynamo -------------------------------------------------------------------------------------


def test_dynamo_cost_is_prefill_blocks_less_tier_credit_plus_decode_blocks(index, cache_prefix, worker_view, route_request):
    cache_prefix("dev", PROMPT_40, 6)  # 6 device blocks
    cache_prefix("host", PROMPT_40, 8, Tier.HOST)  # 8 host blocks: credit 8 x 0.75 = 6
    workers = [
        worker_view("dev", num_queued_prefill_tokens=10, num_used_blocks=5),
        worker_view("host", num_used_blocks=3),
        worker_view("idle"),
    ]
    d = make_router(policy="dynamo").route(route_request(PROMPT_40), workers, index, NOW)
    # (queued + 40 prompt tokens) / 4 - credit, + used + 10 incoming blocks:
    #   dev  (10 + 40)/4 - 6 = 6.5, + 5 + 10 = 21.5
    #   host (0 + 40)/4 - 6 = 4,    + 3 + 10 = 17
    #   idle 10 + 0 + 10 = 20
    assert costs_of(d) == {"dev": 21.5, "host": 17.0, "idle": 20.0}
    assert d.decode_worker == "host" and d.cached_tokens == 32  # the real index: 8 blocks held at host
    # kvplane's own host weight (0.9) would give host 10 - 7.2 = 2.8 + 13: Dynamo's is 0.75.
    d = make_router(policy="dynamo", dynamo_host_cache_hit_weight=0.9).route(route_request(PROMPT_40), workers, index, NOW)
    assert costs_of(d)["host"] == pytest.approx(15.8)


def test_dynamo_credit_never_makes_prefill_negative_and_active_requests_count_when_weighted(
    index, cache_prefix, worker_view, route_request
):
    cache_prefix("holder", PROMPT_40, 10)
    workers = [worker_view("holder", num_used_blocks=2, num_running=3), worker_view("idle", num_waiting=1)]
    d = make_router(policy="dynamo").route(route_request(PROMPT_40), workers, index, NOW)
    assert costs_of(d) == {"holder": 0 + 2 + 10, "idle": 10 + 0 + 10}  # max(10 - 10, 0) = 0
    d = make_router(policy="dynamo", dynamo_active_request_weight=4.0).route(route_request(PROMPT_40), workers, index, NOW)
    assert costs_of(d) == {"holder": 12 + 4 * 3, "idle": 20 + 4 * 1}
    assert d.decode_worker == "idle"


def test_dynamo_ties_are_drawn_by_the_seeded_rng(index, worker_view, route_request):
    workers = [worker_view(f"w{i}") for i in range(4)]
    picks = {make_router(seed, policy="dynamo").route(route_request(PROMPT_40), workers, index, NOW).decode_worker for seed in range(20)}
    assert len(picks) > 1  # equal costs: not always the first


# -- sglang -------------------------------------------------------------------------------------


def test_sglang_follows_its_own_tree_not_the_kv_events(index, cache_prefix, worker_view, route_request):
    router = make_router(policy="sglang")
    workers = [worker_view("w0"), worker_view("w1"), worker_view("w2")]
    # The index says w2 holds the prompt, but the gateway never routed it there: its tree is
    # empty, the match rate 0 <= 0.3, so the first worker with the fewest in flight wins.
    cache_prefix("w2", PROMPT_40, 10)
    first = routed(router, route_request(PROMPT_40), workers, index)
    assert first.decode_worker == "w0" and "tree match 0.00 <= 0.3: fewest in flight" in first.candidates[0].note
    assert first.cached_tokens == 0  # what w0 really holds (the planner's view, for admission)
    # Now the tree holds the prompt on w0: 36 of 41 tokens match (9 blocks of the 41-token prompt).
    busier = [worker_view("w0", num_running=5), worker_view("w1"), worker_view("w2")]
    again = router.route(route_request(PROMPT_40 + [7]), busier, index, NOW)
    assert again.decode_worker == "w0" and costs_of(again) == {"w0": 0.0, "w1": 1.0, "w2": 1.0}
    assert "tree match 0.98 > 0.3: longest match" in again.candidates[0].note  # 40 / 41


def test_sglang_match_threshold_is_strict(index, worker_view, route_request):
    router = make_router(policy="sglang", sglang_cache_threshold=0.4)
    workers = [worker_view("w0"), worker_view("w1", num_running=1)]
    routed(router, route_request(PROMPT_40[:16]), [worker_view("w1")], index)  # the tree: 4 blocks on w1
    # 16 of 40 tokens = 0.4, not > 0.4: the least loaded (w0) wins; 20 of 40 would be 0.5.
    assert router.route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "w0"
    routed(router, route_request(PROMPT_40[:20]), [worker_view("w1")], index)
    assert router.route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "w1"


def test_sglang_imbalance_needs_both_the_absolute_and_the_relative_gap(index, worker_view, route_request):
    router = make_router(policy="sglang")
    routed(router, route_request(PROMPT_40), [worker_view("hot")], index)  # the tree: the prompt on hot
    # 70 vs 10 in flight: 60 <= 64, balanced, the cache wins.
    workers = [worker_view("cold", num_running=10), worker_view("hot", num_running=70)]
    assert router.route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "hot"
    # 80 vs 10: 70 > 64 and 80 > 15: imbalanced, the fewest in flight wins whatever the cache.
    workers = [worker_view("cold", num_running=10), worker_view("hot", num_running=80)]
    d = router.route(route_request(PROMPT_40), workers, index, NOW)
    assert d.decode_worker == "cold" and d.candidates[0].note.startswith("imbalanced (80 - 10 in flight)")
    # 200 vs 140: 60 apart: balanced again; 300 vs 210: 90 apart but 300 < 1.5 x 210: balanced.
    workers = [worker_view("cold", num_running=210), worker_view("hot", num_running=300)]
    assert router.route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "hot"


def test_sglang_counts_waiting_and_running_and_takes_the_first_of_the_least(index, worker_view, route_request):
    router = make_router(policy="sglang")
    workers = [worker_view("b", num_waiting=1), worker_view("c"), worker_view("a", num_running=1)]
    # c is the only one with 0 in flight; with all equal the first in worker-id order wins, every time.
    assert router.route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "c"
    idle = [worker_view("b"), worker_view("c"), worker_view("a")]
    assert {make_router(s, policy="sglang").route(route_request(OTHER_40), idle, index, NOW).decode_worker for s in range(10)} == {"a"}


def test_sglang_forgets_a_removed_worker(index, worker_view, route_request):
    router = make_router(policy="sglang")
    routed(router, route_request(PROMPT_40), [worker_view("w1")], index)
    router.on_worker_removed(WorkerId("w1"))
    d = router.route(route_request(PROMPT_40), [worker_view("w0", num_running=1), worker_view("w1", num_running=2)], index, NOW)
    assert d.decode_worker == "w0"


# -- llm-d --------------------------------------------------------------------------------------


def test_llm_d_score_is_weighted_queue_kv_and_prefix(index, worker_view, route_request):
    router = make_router(policy="llm-d")
    routed(router, route_request(PROMPT_40[:20]), [worker_view("warm")], index)  # 5 blocks on warm
    workers = [
        worker_view("warm", num_waiting=4, num_used_blocks=50),
        worker_view("mid", num_waiting=2, num_used_blocks=20),
        worker_view("idle", num_used_blocks=0),
    ]
    d = router.route(route_request(PROMPT_40), workers, index, NOW)
    # queue (4 - q) / 4: warm 0, mid 0.5, idle 1; kv 1 - used/100; prefix 5 / 10 blocks on warm.
    #   warm 2 x 0 + 2 x 0.5 + 3 x 0.5 = 2.5;  mid 2 x 0.5 + 2 x 0.8 = 2.6;  idle 2 + 2 = 4
    assert costs_of(d) == pytest.approx({"warm": -2.5, "mid": -2.6, "idle": -4.0})
    assert d.decode_worker == "idle"
    assert str(next(c for c in d.candidates if c.worker_id == "warm").detail) == (
        "score 2.500 = queue 0.000, kv 0.500, prefix 0.500 (weighted)"
    )


def test_llm_d_equal_queues_all_score_one_and_the_prefix_decides(index, worker_view, route_request):
    router = make_router(policy="llm-d")
    routed(router, route_request(PROMPT_40), [worker_view("warm")], index)
    workers = [worker_view("cold", num_waiting=3), worker_view("warm", num_waiting=3, num_used_blocks=40)]
    d = router.route(route_request(PROMPT_40), workers, index, NOW)
    # cold 2 + 2 = 4; warm 2 + 2 x 0.6 + 3 x 1 = 6.2
    assert costs_of(d) == pytest.approx({"cold": -4.0, "warm": -6.2}) and d.decode_worker == "warm"


def test_llm_d_records_the_prefill_worker_too_and_caps_the_prompt(index, worker_view, route_request):
    router = make_router(policy="llm-d", llmd_max_prefix_blocks=4, disagg_threshold_tokens=1)
    workers = [worker_view("d0", Role.DECODE), worker_view("p0", Role.PREFILL)]
    d = routed(router, route_request(PROMPT_40, disagg=DisaggMode.ALWAYS), workers, index)
    assert (d.decode_worker, d.prefill_worker) == ("d0", "p0")
    believed = router.policy.index.overlaps(hash_blocks(PROMPT_40, BLOCK_SIZE, model_salt=MODEL))
    assert {w: s.num_blocks for w, s in believed.items()} == {"d0": 4, "p0": 4}  # 4 of 10 blocks recorded


def test_llm_d_lru_capacity_is_the_workers_kv_blocks(index, worker_view, route_request):
    router = make_router(policy="llm-d")
    small = [worker_view("w", num_total_blocks=12)]
    routed(router, route_request(PROMPT_40), small, index)  # 10 blocks
    routed(router, route_request(OTHER_40), small, index)  # 10 more: 8 of the first evicted
    assert router.policy.index.num_blocks(WorkerId("w")) == 12
    assert router.policy.index.overlaps(hash_blocks(PROMPT_40, BLOCK_SIZE, model_salt=MODEL)) == {}  # its head went first


# -- shared -------------------------------------------------------------------------------------


def test_routed_cache_is_an_lru_per_worker():
    cache = RoutedCache()
    a, b = hash_blocks(PROMPT_40, 4, "m"), hash_blocks(OTHER_40, 4, "m")
    cache.record(WorkerId("w"), a[:6], capacity_blocks=8)
    cache.record(WorkerId("w"), b[:3], capacity_blocks=8)  # 9 > 8: a[0] goes
    assert cache.overlaps(a) == {} and cache.overlaps(b)["w"].num_blocks == 3
    cache.record(WorkerId("w"), a[:6], capacity_blocks=8)  # a's blocks touched again: b's go
    assert cache.overlaps(a)["w"].num_blocks == 6
    # b[0] was the oldest: b[1] and b[2] are still believed held, but not the head they follow.
    assert cache.overlaps(b) == {} and cache.num_blocks(WorkerId("w")) == 8
    cache.record(WorkerId("v"), a[:2], capacity_blocks=8)
    assert {w: s.num_blocks for w, s in cache.overlaps(a).items()} == {"w": 6, "v": 2}
    cache.forget_worker(WorkerId("w"))
    assert set(cache.overlaps(a)) == {"v"} and cache.num_blocks(WorkerId("w")) == 0


def test_peer_params_are_validated_and_reach_the_router_from_flags():
    with pytest.raises(ValueError, match="SglangParams.sglang_cache_threshold must be <= 1"):
        make_router(policy="sglang", sglang_cache_threshold=1.5)
    with pytest.raises(ValueError, match="SglangParams.sglang_balance_abs_threshold must be an integer"):
        make_router(policy="sglang", sglang_balance_abs_threshold=1.5)
    with pytest.raises(ValueError, match="LlmDParams.llmd_max_prefix_blocks must be > 0"):
        make_router(policy="llm-d", llmd_max_prefix_blocks=0)
    with pytest.raises(ValueError, match="DynamoParams.dynamo_prefill_load_scale must be >= 0"):
        make_router(policy="dynamo", dynamo_prefill_load_scale=-1.0)
    import argparse

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, RouterConfig())
    args = parser.parse_args(["--routing-policy", "sglang", "--sglang-balance-abs-threshold", "8"])
    config = config_from_args(args, RouterConfig())
    assert config.policy_name == "sglang" and config.policy.sglang_balance_abs_threshold == 8


def test_dynamo_reads_kv_events_as_they_arrive(index, worker_view, route_request):
    """Unlike sglang and llm-d, Dynamo's default view is the event-fed index."""
    router = make_router(policy="dynamo")
    workers = [worker_view("a"), worker_view("b")]
    hashes = hash_blocks(PROMPT_40, BLOCK_SIZE, model_salt=MODEL)
    index.apply_batch(WorkerId("b"), 0, [StoredEvent(tuple(hashes), Tier.DEVICE)])
    assert router.route(route_request(PROMPT_40), workers, index, NOW).decode_worker == "b"
