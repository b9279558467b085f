"""What routing policies and the router share: the request, candidate costs, the decision, the
policy base class (its hooks no-ops). Policies import this module and never the router, so every
import points one way: router -> policies -> routing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from kvplane.controlplane.core.index import CacheIndex, OverlapScore
from kvplane.controlplane.core.views import WorkerView
from kvplane.types import PRIORITIES, BlockHash, DisaggMode, Objective, Priority, WorkerId

if TYPE_CHECKING:
    from kvplane.controlplane.core.inflow import Inflow


@dataclass(frozen=True, slots=True)
class RouteRequest:
    model: str
    prompt_token_ids: Sequence[int]
    max_tokens: int
    disagg: DisaggMode
    cache_salt: str = ""
    priority: Priority = PRIORITIES[0]


@dataclass(frozen=True, slots=True)
class CandidateCost:
    worker_id: WorkerId
    cost: float
    cached_tokens: int
    prefill_tokens: int  # uncached tokens this worker would compute
    # What the cost is made of: a sentence, or an object whose str() is one (cost.CostBreakdown),
    # so that pricing a thousand candidates formats only the few anyone reads.
    detail: object

    @property
    def note(self) -> str:
        return str(self.detail)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    decode_worker: WorkerId
    prefill_worker: WorkerId | None
    disaggregated: bool
    reason: str
    prompt_tokens: int
    cached_tokens: int  # on the decode worker
    candidates: Sequence[CandidateCost]  # decode candidates, cheapest first (cost.Priced: made when read)
    # Fetch instead of recompute: the decode worker pulls this worker's cached prefix blocks.
    fetch_from: WorkerId | None = None
    fetch_tokens: int = 0  # cached tokens the fetch is expected to bring beyond the decode worker's own
    fetch_s: float = 0.0  # the fetch's predicted seconds (kvplane policy)
    block_hashes: tuple[BlockHash, ...] = field(default=(), compare=False, repr=False)
    # The cache index's own overlaps of the prompt (no predictions): what the blocks really are.
    index_overlaps: Mapping[WorkerId, OverlapScore] = field(default_factory=dict, compare=False, repr=False)
    # The overlaps the policy priced with (predicted prefixes included); None: index_overlaps.
    policy_overlaps: Mapping[WorkerId, OverlapScore] | None = field(default=None, compare=False, repr=False)

    @property
    def priced_overlaps(self) -> Mapping[WorkerId, OverlapScore]:
        """The prompt's prefix per worker as the policy priced it: a request queues behind the
        work computing a predicted prefix, and reuses it."""
        return self.policy_overlaps if self.policy_overlaps is not None else self.index_overlaps


@dataclass(frozen=True, slots=True)
class RouteContext:
    """What a routing policy sees of one request."""

    request: RouteRequest
    num_prompt_tokens: int
    block_size: int
    block_hashes: Sequence[BlockHash]
    overlaps: Mapping[WorkerId, OverlapScore]  # as the policy sees them (kvplane: with predictions)
    index: CacheIndex
    now: float
    # Policies that price by load may return, of the workers holding none of the prompt, only
    # this many cheapest (and any tied with the last): none of the others can win (RouterConfig).
    max_uncached_candidates: int = 0  # 0 = price every worker
    # The cache index's own overlaps (what `overlaps` extends): blocks that exist now.
    cached: Mapping[WorkerId, OverlapScore] = field(default_factory=dict)
    # What pricing in seconds needs (the planner's): the request's objective (None: unknown), the
    # KV link rate it has measured, and its calibration offsets (TTFT local, TTFT remote, TPOT).
    objective: Objective | None = None
    link_bytes_per_s: float = 1e9
    offsets: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # Per row of the workers' table: the prefill work arriving there per second (inflow.py), which
    # the steps of the decodes there carry (None: none known).
    prefill_inflow: Inflow | None = None


@dataclass(frozen=True, slots=True)
class FetchPlan:
    worker_id: WorkerId
    num_tokens: int
    reason: str
    seconds: float = 0.0  # predicted pull time (0: not predicted)


@dataclass(frozen=True, slots=True)
class Placement:
    """A policy's whole placement of a request (the `place` hook): the decode candidates in its
    order of preference (the first is chosen), where prefill runs (None: on the decode worker),
    the fetch, and why."""

    candidates: Sequence[CandidateCost]
    prefill_worker: WorkerId | None
    fetch: FetchPlan | None
    reason: str


class NoCandidateError(Exception):
    """No worker can take the request; the message says why (unknown model, all draining, ...).

    `transient`: workers that could take it exist but are out for now (failed this request,
    stalled, silent): worth retrying later, unlike a deployment that lacks them."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class NoPrefillWorkerError(NoCandidateError):
    """disagg 'always' with no prefill worker to use: unless transient, the deployment lacks one."""


class RoutingPolicyParams(Protocol):
    """A policy's own parameters: a frozen dataclass whose `name` selects the policy."""

    name: ClassVar[str]

    def validate(self) -> None: ...


class RoutingPolicy:
    """What a routing policy does; every hook but `costs` defaults to nothing."""

    def costs(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> Sequence[CandidateCost]:
        """Candidate costs in any order: a list, or cost.Priced columns."""
        raise NotImplementedError

    def overlaps(
        self, index: CacheIndex, block_hashes: Sequence[BlockHash], now: float, cached: Mapping[WorkerId, OverlapScore]
    ) -> Mapping[WorkerId, OverlapScore]:
        """The overlaps the policy prices with; `cached` is index.overlaps(block_hashes)."""
        return cached

    def fetch(
        self, ctx: RouteContext, decode: WorkerView, decode_cost: CandidateCost, sources: Callable[[], Sequence[WorkerView]]
    ) -> FetchPlan | None:
        """Whether the decode worker should pull a cached prefix from one of `sources()` (the other
        active workers KV can move from; made only when called) instead of computing it."""
        return None

    def place(
        self,
        ctx: RouteContext,
        decode: Sequence[WorkerView],
        prefill: Sequence[WorkerView],
        sources: Callable[[], Sequence[WorkerView]],
        rng,
    ) -> Placement | None:
        """The decode worker, prefill placement and fetch at once (`prefill`: every active worker
        that can prefill the prompt; `sources()`: workers KV can be fetched from), or None to let
        the router place by `costs`, its prefill threshold and `fetch`."""
        return None

    def on_routed(self, decision: RouteDecision, now: float) -> None:
        pass

    def on_stored(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash]) -> None:
        pass

    def on_worker_removed(self, worker_id: WorkerId) -> None:
        pass
