"""Routing policies: which decode worker takes a request. One Protocol, one module per policy,
one registry (`make_routing_policy`), chosen by RouterConfig.policy (`--routing-policy`).

A policy prices the decode candidates (lowest cost wins; the Router breaks ties with its seeded
rng) and may hook the rest of a request's life: which cached prefix it sees (`overlaps`), whether
to fetch a cached prefix from another worker (`fetch`), what was routed (`on_routed`) and what the
workers reported (`on_stored`, `on_worker_removed`). Hooks default to no-ops in `PolicyHooks`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from controlplane.core.index import CacheIndex, OverlapScore
from kvplane.types import BlockHash, WorkerId

if TYPE_CHECKING:
    from controlplane.core.router import (
        CandidateCost,
        FetchPlan,
        RouteContext,
        RouteDecision,
        RouterConfig,
        WorkerView,
    )


class RoutingPolicy(Protocol):
    def costs(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[CandidateCost]: ...

    def overlaps(self, index: CacheIndex, block_hashes: Sequence[BlockHash], now: float) -> dict[WorkerId, OverlapScore]: ...

    def fetch(
        self, ctx: RouteContext, decode: WorkerView, decode_cost: CandidateCost, sources: Sequence[WorkerView]
    ) -> FetchPlan | None: ...

    def on_routed(self, decision: RouteDecision, now: float) -> None: ...

    def on_stored(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash]) -> None: ...

    def on_worker_removed(self, worker_id: WorkerId) -> None: ...


class PolicyHooks:
    """No-op defaults for the optional hooks."""

    def overlaps(self, index: CacheIndex, block_hashes: Sequence[BlockHash], now: float) -> dict[WorkerId, OverlapScore]:
        return index.overlaps(block_hashes)

    def fetch(self, ctx, decode, decode_cost, sources) -> FetchPlan | None:  # noqa: ANN001
        return None

    def on_routed(self, decision: RouteDecision, now: float) -> None:
        pass

    def on_stored(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash]) -> None:
        pass

    def on_worker_removed(self, worker_id: WorkerId) -> None:
        pass


def _factories() -> dict[str, Callable[[RouterConfig], RoutingPolicy]]:
    from controlplane.core.policies.kvplane import KvplanePolicy
    from controlplane.core.policies.least_load import LeastLoadPolicy
    from controlplane.core.policies.prefix_only import PrefixOnlyPolicy
    from controlplane.core.policies.round_robin import RoundRobinPolicy

    return {
        "kvplane": KvplanePolicy,
        "round-robin": RoundRobinPolicy,
        "least-load": LeastLoadPolicy,
        "prefix-only": PrefixOnlyPolicy,
    }


POLICY_NAMES = ("kvplane", "round-robin", "least-load", "prefix-only")


def routing_policy_names() -> tuple[str, ...]:
    return POLICY_NAMES


def make_routing_policy(config: RouterConfig) -> RoutingPolicy:
    return _factories()[config.policy](config)
