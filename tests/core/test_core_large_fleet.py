"""Routing a large fleet: only workers that can win are priced in full, predictions of placements
are made when admission reads them, and predicted prefixes are found without visiting every
worker. Each test checks the shortcut against the full computation it replaces."""

from __future__ import annotations

import random

from controlplane.core.index import CacheIndex, StoredEvent
from controlplane.core.planner import Planner, PlannerConfig
from controlplane.core.predictions import PrefixPredictions
from controlplane.core.settings import ClusterSettings
from controlplane.core.views import ClusterView
from kvplane.block_hash import hash_blocks
from kvplane.latency import StepTimeModel
from kvplane.types import DisaggMode, Role, Tier, WorkerId
from tests.core.conftest import BLOCK_SIZE, MODEL, make_request, make_router, make_router_config, make_worker_view

LATENCY = StepTimeModel((0.01, 1e-4, 0.0, 1e-4, 0.0), num_samples=50, mean_abs_pct_error=0.05)


def _fleet(rng: random.Random, index: CacheIndex, prompts: list[list[int]], size: int):
    """`size` workers of every role with distinct loads, some holding a prefix of one prompt."""
    workers = []
    for i in range(size):
        role = (Role.BOTH, Role.DECODE, Role.PREFILL)[i % 3]
        workers.append(
            make_worker_view(
                f"w{i:03d}",
                role,
                num_queued_prefill_tokens=rng.randrange(0, 400),
                num_used_blocks=rng.randrange(0, 90),
                num_running=rng.randrange(0, 8),
                latency=LATENCY,
            )  # fmt: skip
        )
        if rng.random() < 0.2:
            prompt = rng.choice(prompts)
            hashes = hash_blocks(prompt, BLOCK_SIZE, model_salt=MODEL, tenant_salt="")
            index.apply_batch(WorkerId(f"w{i:03d}"), 0, [StoredEvent(tuple(hashes[: rng.randrange(1, len(hashes))]), Tier.DEVICE)])
    return workers


def test_pricing_only_the_cheapest_uncached_workers_routes_as_pricing_all():
    rng = random.Random(3)
    prompts = [[rng.randrange(1000) for _ in range(40)] for _ in range(4)]
    for trial in range(40):
        index = CacheIndex()
        workers = _fleet(rng, index, prompts, 60)
        disagg = (DisaggMode.AUTO, DisaggMode.ALWAYS, DisaggMode.NEVER)[trial % 3]
        request = make_request(rng.choice(prompts) + [trial], disagg=disagg)
        for policy in ("kvplane", "least-load"):
            extra = {"disagg_threshold_tokens": 8} if policy == "kvplane" else {}
            full = make_router(policy=policy, max_uncached_candidates=0, **extra).route(request, workers, index, 1.0)
            pruned = make_router(policy=policy, max_uncached_candidates=3, **extra).route(request, workers, index, 1.0)
            # Same winner at the same cost (ties are drawn by the same seeded rng among the same tied set).
            assert (pruned.decode_worker, pruned.prefill_worker, pruned.candidates[0].cost) == (
                full.decode_worker, full.prefill_worker, full.candidates[0].cost,
            ), f"trial {trial}, {policy}"  # fmt: skip
            assert len(pruned.candidates) < len(full.candidates)
            # What was priced was priced the same.
            full_costs = {c.worker_id: c.cost for c in full.candidates}
            assert all(full_costs[c.worker_id] == c.cost for c in pruned.candidates)


def test_threshold_admission_predicts_only_the_placement_it_takes():
    rng = random.Random(5)
    index = CacheIndex()
    prompts = [[rng.randrange(1000) for _ in range(40)]]
    workers = _fleet(rng, index, prompts, 30)
    planner = Planner(PlannerConfig(router=make_router_config(max_uncached_candidates=0)), random.Random(0))
    predicted = []
    original = planner._predicted
    planner._predicted = lambda *args: predicted.append(args[1]) or original(*args)
    plan = planner.plan(make_request(prompts[0], disagg=DisaggMode.NEVER), ClusterView(tuple(workers), index), ClusterSettings(), 1.0)
    assert len(plan.options) > 10 and plan.prediction is not None
    assert len(predicted) == 1 and predicted[0].decode_worker == plan.decode_worker
    # Reading the others predicts each once, as the eager planner did.
    assert all(o.prediction is not None for o in plan.options) and len(predicted) == len(plan.options)
    assert [o.decode_worker for o in plan.options[1:3]] == [o.decode_worker for o in list(plan.options)[1:3]]


def test_predicted_prefixes_are_found_through_their_first_block_and_forgotten():
    index = CacheIndex()
    predictions = PrefixPredictions(ttl_s=5.0)
    a = hash_blocks(list(range(40)), BLOCK_SIZE, model_salt=MODEL, tenant_salt="")
    b = hash_blocks(list(range(100, 140)), BLOCK_SIZE, model_salt=MODEL, tenant_salt="")
    predictions.record(WorkerId("p"), a, now=0.0)
    predictions.record(WorkerId("q"), b, now=0.0)
    # w holds a's first 3 blocks for real and is predicted to hold the rest.
    index.apply_batch(WorkerId("w"), 0, [StoredEvent(tuple(a[:3]), Tier.HOST)])
    predictions.record(WorkerId("w"), a[3:], now=0.0)
    found = predictions.overlaps(index, a, now=1.0)
    assert {w: o.num_blocks for w, o in found.items()} == {"p": len(a), "w": len(a)}
    assert dict(found["w"].blocks_by_tier) == {Tier.DEVICE: len(a) - 3, Tier.HOST: 3, Tier.DISK: 0}
    assert predictions.overlaps(index, a, now=6.0) == index.overlaps(a)  # expired
    # Confirmed and forgotten predictions leave nothing behind in the first-block map.
    predictions.confirm(WorkerId("p"), a)
    predictions.forget_worker(WorkerId("q"))
    predictions.forget_worker(WorkerId("w"))
    assert predictions._first_block_to_workers == {}
