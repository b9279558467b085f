"""ClusterState's glue for the index's credit rule (issue 28): a dispatched plan vouches for its
workers, a relayed answer for its decode worker. A real planner and index; no processes."""

from __future__ import annotations

import random

from kvplane.block_hash import hash_blocks
from kvplane.controlplane.cluster_state import ClusterState
from kvplane.controlplane.core.index import StoredEvent
from kvplane.controlplane.core.planner import Plan, Planner, PlannerConfig
from kvplane.controlplane.core.settings import ClusterSettings
from kvplane.controlplane.core.views import ClusterView
from kvplane.controlplane.store import MemoryStore
from kvplane.types import Tier, WorkerId
from tests.core.conftest import make_request, make_worker_view


def test_routed_prompts_and_relayed_answers_are_credited_on_their_worker_and_nothing_else():
    state = ClusterState(MemoryStore())
    prompt, answer = list(range(10)), [50, 51, 52, 53, 54, 55]  # block size 4: 2 prompt blocks, 2 more with the answer
    plan = Planner(PlannerConfig(), rng=random.Random(0)).plan(
        make_request(prompt), ClusterView((make_worker_view("a"),), state.index), ClusterSettings(), now=0.0
    )
    assert isinstance(plan, Plan) and plan.decode_worker == "a"
    every = hash_blocks([*prompt, *answer], 4, model_salt="m")
    state.index.apply_batch(WorkerId("a"), 0, [StoredEvent(tuple(every), Tier.DEVICE)])
    state.index.apply_batch(WorkerId("b"), 0, [StoredEvent(tuple(every), Tier.DEVICE)])
    assert state.index.overlaps(every) == {}  # nothing routed yet: all of it uncredited
    state.routed(plan)
    assert {w: s.num_blocks for w, s in state.index.overlaps(every).items()} == {"a": 2}
    state.answered(plan, [*prompt, *answer])
    assert {w: s.num_blocks for w, s in state.index.overlaps(every).items()} == {"a": 4}
    assert state.index.num_uncredited(WorkerId("b")) == 4
