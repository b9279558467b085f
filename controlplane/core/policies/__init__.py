"""Routing policies: which decode worker takes a request. One base class (routing.RoutingPolicy),
one module per policy, and this registry, the one list of them.

Each policy module holds a params dataclass whose `name` selects the policy (RouterConfig.policy,
`--routing-policy`) and the policy class, built from its params and the router's CostConfig.
A policy prices the decode candidates (lowest cost wins; the Router breaks ties with its seeded
rng) and may hook the rest of a request's life: which cached prefix it sees (`overlaps`), whether
to fetch a cached prefix from another worker (`fetch`), what was routed (`on_routed`) and what the
workers reported (`on_stored`, `on_worker_removed`). Hooks default to no-ops in routing.RoutingPolicy.

Besides kvplane's own policy and three baselines (round-robin, least-load, prefix-only), the
peers' rules with their defaults: `dynamo`, `sglang`, `llm-d` (each module says which source
file and version it follows, and which planner signal stands in where a peer's is missing).
"""

from __future__ import annotations

from collections.abc import Callable

from kvplane.controlplane.core.cost import CostConfig
from kvplane.controlplane.core.policies.dynamo import DynamoParams, DynamoPolicy
from kvplane.controlplane.core.policies.kvplane import KvplaneParams, KvplanePolicy
from kvplane.controlplane.core.policies.least_load import LeastLoadParams, LeastLoadPolicy
from kvplane.controlplane.core.policies.llm_d import LlmDParams, LlmDPolicy
from kvplane.controlplane.core.policies.prefix_only import PrefixOnlyParams, PrefixOnlyPolicy
from kvplane.controlplane.core.policies.round_robin import RoundRobinParams, RoundRobinPolicy
from kvplane.controlplane.core.policies.sglang import SglangParams, SglangPolicy
from kvplane.controlplane.core.routing import RoutingPolicy, RoutingPolicyParams

# The one list of routing policies: params type -> the policy it builds. The first is the default.
_POLICIES: dict[type, Callable[..., RoutingPolicy]] = {
    KvplaneParams: KvplanePolicy,
    RoundRobinParams: RoundRobinPolicy,
    LeastLoadParams: LeastLoadPolicy,
    PrefixOnlyParams: PrefixOnlyPolicy,
    # The peers' rules, with their defaults, for `kvplane sim --compare-routing` and the grid.
    DynamoParams: DynamoPolicy,
    SglangParams: SglangPolicy,
    LlmDParams: LlmDPolicy,
}
# The peers' policies: the ones kvplane's targets are measured against (kvplane sim --grid).
PEER_POLICIES = (DynamoParams.name, SglangParams.name, LlmDParams.name)
_PARAMS_BY_NAME: dict[str, type] = {params.name: params for params in _POLICIES}


def routing_policy_names() -> tuple[str, ...]:
    return tuple(_PARAMS_BY_NAME)


def params_types() -> tuple[type, ...]:
    """Every policy's params dataclass, in registry order."""
    return tuple(_POLICIES)


def params_type(name: str) -> type:
    """The params dataclass of the policy called `name`."""
    try:
        return _PARAMS_BY_NAME[name]
    except KeyError:
        raise ValueError(f"routing policy {name!r} is unknown; choose one of {routing_policy_names()}") from None


def default_params() -> RoutingPolicyParams:
    return next(iter(_POLICIES))()


def check_params(params: object) -> None:
    """`params` is a registered policy's params, valid."""
    if type(params) not in _POLICIES:
        raise ValueError(f"RouterConfig.policy must be the params of one of {routing_policy_names()}, got {params!r}")
    params.validate()  # type: ignore[attr-defined]


def make_routing_policy(params: RoutingPolicyParams, cost: CostConfig) -> RoutingPolicy:
    check_params(params)
    return _POLICIES[type(params)](params, cost)
