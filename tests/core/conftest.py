"""Shared factories for the routing-core tests: worker views, requests, cached prefixes, routers.

Exposed as fixtures that return plain functions, so tests build exactly the fleet they need.
Defaults: model "m", block size 4, an idle decode worker with 100 blocks and a 4096 context.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence

import pytest

from kvplane.block_hash import hash_blocks
from kvplane.controlplane.core.cost import CostConfig
from kvplane.controlplane.core.index import CacheIndex, StoredEvent
from kvplane.controlplane.core.policies import params_type
from kvplane.controlplane.core.router import Router, RouterConfig
from kvplane.controlplane.core.routing import RouteRequest
from kvplane.controlplane.core.views import WorkerLoadView, WorkerView
from kvplane.latency import StepTimeModel
from kvplane.types import BlockHash, DisaggMode, Priority, Role, Tier, WorkerId

MODEL = "m"
BLOCK_SIZE = 4


def make_worker_view(
    worker_id: str,
    role: Role = Role.DECODE,
    *,
    model: str = MODEL,
    block_size: int = BLOCK_SIZE,
    active: bool = True,
    num_running: int = 0,
    num_waiting: int = 0,
    num_queued_prefill_tokens: int = 0,
    num_used_blocks: int = 0,
    num_total_blocks: int = 100,
    max_context: int = 4096,
    block_nbytes: int = 0,
    latency: StepTimeModel | None = None,
    running_remaining_tokens: Sequence[int] = (),
    running_context_tokens: int = 0,
    reported_at: float | None = None,
) -> WorkerView:
    load = WorkerLoadView(
        num_running=num_running,
        num_waiting=num_waiting,
        num_queued_prefill_tokens=num_queued_prefill_tokens,
        num_free_blocks=num_total_blocks - num_used_blocks,
        num_used_blocks=num_used_blocks,
        num_total_blocks=num_total_blocks,
        running_remaining_tokens=tuple(running_remaining_tokens),
        running_context_tokens=running_context_tokens,
    )
    return WorkerView(
        worker_id=WorkerId(worker_id),
        role=role,
        model=model,
        block_size=block_size,
        active=active,
        load=load,
        max_context=max_context,
        block_nbytes=block_nbytes,
        latency=latency,
        reported_at=reported_at,
    )


def make_request(
    prompt_token_ids: Sequence[int],
    *,
    disagg: DisaggMode = DisaggMode.NEVER,
    model: str = MODEL,
    max_tokens: int = 16,
    cache_salt: str = "",
    priority: Priority = "interactive",
) -> RouteRequest:
    return RouteRequest(
        model=model, prompt_token_ids=list(prompt_token_ids), max_tokens=max_tokens, disagg=disagg,
        cache_salt=cache_salt, priority=priority,
    )  # fmt: skip


def make_router_config(policy: str = "kvplane", **overrides) -> RouterConfig:
    """RouterConfig with each override set on whichever of RouterConfig, its CostConfig or the
    policy's params has that field."""
    params_cls = params_type(policy)
    owners = {"router": RouterConfig, "cost": CostConfig, "policy": params_cls}
    by_owner: dict[str, dict] = {owner: {} for owner in owners}
    for name, value in overrides.items():
        owner = next((o for o, cls in owners.items() if name in {f.name for f in dataclasses.fields(cls)}), None)
        assert owner is not None, f"no router, cost or {policy} policy field {name!r}"
        by_owner[owner][name] = value
    return RouterConfig(policy=params_cls(**by_owner["policy"]), cost=CostConfig(**by_owner["cost"]), **by_owner["router"])


def make_router(seed: int = 0, policy: str = "kvplane", **overrides) -> Router:
    return Router(make_router_config(policy, **overrides), rng=random.Random(seed))


class PrefixCacher:
    """Marks the first blocks of a prompt as held by a worker, one batch per call."""

    def __init__(self, index: CacheIndex) -> None:
        self.index = index
        self._next_seq: dict[WorkerId, int] = {}

    def __call__(
        self,
        worker_id: str,
        prompt_token_ids: Sequence[int],
        num_blocks: int,
        tier: Tier = Tier.DEVICE,
        *,
        first_block: int = 0,
        cache_salt: str = "",
        model: str = MODEL,
    ) -> None:
        hashes = hash_blocks(prompt_token_ids, BLOCK_SIZE, model_salt=model, tenant_salt=cache_salt)
        assert first_block + num_blocks <= len(hashes), "test asks to cache more blocks than the prompt has"
        seq = self._next_seq.get(WorkerId(worker_id), 0)
        self._next_seq[WorkerId(worker_id)] = seq + 1
        event = StoredEvent(tuple(hashes[first_block : first_block + num_blocks]), tier)
        assert self.index.apply_batch(WorkerId(worker_id), seq, [event])


def bh(name: str) -> BlockHash:
    """A readable stand-in block hash for index tests."""
    return BlockHash(name.encode())


@pytest.fixture
def worker_view() -> Callable[..., WorkerView]:
    return make_worker_view


@pytest.fixture
def route_request() -> Callable[..., RouteRequest]:
    return make_request


@pytest.fixture
def index() -> CacheIndex:
    return CacheIndex()


@pytest.fixture
def cache_prefix(index: CacheIndex) -> PrefixCacher:
    return PrefixCacher(index)


@pytest.fixture
def block_hash() -> Callable[[str], BlockHash]:
    return bh
