"""Router: pick the decode worker by cached prefix and load, then decide where prefill runs.

Rule (Dynamo's KV-router cost, lib/kv-router): hash the prompt into chained blocks, look up each
worker's longest cached prefix, and give it overlap credit = sum over matched leading blocks of
the weight of the fastest tier holding the block. With blocks = ceil(tokens / block_size):

    cost = prefill_load_scale * max(queued_prefill_blocks + prompt_blocks - overlap_credit, 0)
           + used_blocks

The lowest cost wins (temperature 0; ties drawn by the seeded rng) or, with temperature > 0, a
worker is sampled with probability proportional to exp(-cost / temperature). With no overlap
anywhere the cost is pure load, so a cold cache spreads over equally loaded workers instead of
piling on one (the failure of SGLang's "smallest tree" fallback).

Then prefill placement (Dynamo's conditional disaggregation): NEVER prefills on the decode
worker; ALWAYS needs another active prefill-capable worker; AUTO goes remote only when the
uncached tokens on the decode worker reach disagg_threshold_tokens and some prefill worker has
fewer than max_prefill_queue_tokens queued. The prefill worker is chosen by the same cost among
the prefill candidates, role PREFILL before BOTH at equal cost.

Which decode worker wins is the routing policy's call (controlplane/core/policies/: kvplane,
the cost above plus tier weights, a load guard, predicted prefixes and fetch-instead-of-recompute;
round-robin, least-load and prefix-only as baselines); the prefill worker of a disaggregated
request is always chosen by the cost above.

Parameters: RouterConfig below, the single source of their defaults.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields

from controlplane.core.index import CacheIndex, OverlapScore
from kvplane.block_hash import hash_blocks
from kvplane.types import BlockHash, DisaggMode, Role, Tier, WorkerId

# Costs closer than this are a tie: tier weights are fractions, and float sums of the same
# credit in a different order must not decide the route.
_COST_TIE_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class RouterConfig:
    # Which decode worker wins: "kvplane", "round-robin", "least-load" or "prefix-only".
    policy: str = "kvplane"
    prefill_load_scale: float = 1.0
    # Credit per cached block by tier: the share of a block's recompute that loading it saves,
    # 1 - load time / recompute time, measured with `kvplane bench tiers` (docs/benchmarks.md:
    # host 0.99, disk 0.96 here) and rounded down for slower links than this machine's memcpy
    # (PCIe to a GPU, a cold NVMe read).
    overlap_weight_device: float = 1.0
    overlap_weight_host: float = 0.9
    overlap_weight_disk: float = 0.5
    # Remote prefill only when the uncached prompt tokens on the decode worker reach this.
    disagg_threshold_tokens: int = 2048
    # A prefill worker with this many queued prefill tokens or more is busy: prefill locally.
    max_prefill_queue_tokens: int = 16384
    # 0 = argmin; > 0 samples over softmax(-cost / temperature).
    temperature: float = 0.0
    # kvplane policy. Predicted prefixes: a routed prompt counts as cached on its worker this long.
    prediction_ttl_s: float = 5.0
    # Load guard: a candidate's cache credit is multiplied by (allowed / value) ** guard_power when
    # its queued prefill tokens, KV use or requests exceed allowed = guard_ratio x pool mean + slack.
    # guard_ratio 0 = off.
    guard_ratio: float = 1.5
    guard_power: float = 2.0
    guard_slack_tokens: int = 512
    guard_slack_kv_usage: float = 0.1
    guard_slack_requests: int = 2
    # Fetch instead of recompute: pull at least this many more cached blocks from a busier holder
    # when overhead + bytes / bandwidth < tokens / prefill rate (0 = off). Rates: docs/benchmarks.md.
    fetch_min_blocks: int = 4
    fetch_bytes_per_s: float = 7e8
    fetch_overhead_ms: float = 6.0
    prefill_tokens_per_s: float = 20000.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        from controlplane.core.policies import routing_policy_names

        if self.policy not in routing_policy_names():
            raise ValueError(f"RouterConfig.policy {self.policy!r} is unknown; choose one of {routing_policy_names()}")
        for f in fields(self):
            if f.name == "policy":
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"RouterConfig.{f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"RouterConfig.{f.name} must be >= 0, got {value!r}")
        for name in ("fetch_bytes_per_s", "prefill_tokens_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RouterConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("disagg_threshold_tokens", "max_prefill_queue_tokens", "guard_slack_tokens", "guard_slack_requests", "fetch_min_blocks"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"RouterConfig.{name} must be an integer number of tokens, got {getattr(self, name)!r}")
        if self.max_prefill_queue_tokens == 0:
            raise ValueError("RouterConfig.max_prefill_queue_tokens must be > 0, or every prefill worker counts as busy")
        if not (self.overlap_weight_device >= self.overlap_weight_host >= self.overlap_weight_disk):
            raise ValueError(
                "RouterConfig overlap weights must not increase with slower tiers "
                f"(overlap_weight_device {self.overlap_weight_device} >= overlap_weight_host "
                f"{self.overlap_weight_host} >= overlap_weight_disk {self.overlap_weight_disk}), "
                "because a block held at several tiers is credited at its fastest"
            )

    def tier_weight(self, tier: Tier) -> float:
        if tier is Tier.DEVICE:
            return self.overlap_weight_device
        if tier is Tier.HOST:
            return self.overlap_weight_host
        return self.overlap_weight_disk


@dataclass(frozen=True, slots=True)
class WorkerLoadView:
    num_running: int
    num_waiting: int
    num_queued_prefill_tokens: int
    num_free_blocks: int
    num_used_blocks: int
    num_total_blocks: int


@dataclass(frozen=True, slots=True)
class WorkerView:
    worker_id: WorkerId
    role: Role
    model: str
    block_size: int
    active: bool  # False while draining: finishes its work, takes no new requests
    load: WorkerLoadView
    max_context: int
    block_nbytes: int = 0  # KV bytes per block (0 = unknown: never a fetch source or target)
    # New KV blocks of requests routed here since the last load report: the kvplane policy's load
    # guard counts them in KV use. Not in the cost: a burst's first request would then outweigh
    # the very prefix it is computing for the others.
    pending_blocks: int = 0


@dataclass(frozen=True, slots=True)
class RouteRequest:
    model: str
    prompt_token_ids: Sequence[int]
    max_tokens: int
    disagg: DisaggMode
    cache_salt: str = ""


@dataclass(frozen=True, slots=True)
class CandidateCost:
    worker_id: WorkerId
    cost: float
    cached_tokens: int
    prefill_tokens: int  # uncached tokens this worker would compute
    note: str


@dataclass(frozen=True, slots=True)
class RouteDecision:
    decode_worker: WorkerId
    prefill_worker: WorkerId | None
    disaggregated: bool
    reason: str
    prompt_tokens: int
    cached_tokens: int  # on the decode worker
    candidates: tuple[CandidateCost, ...]  # decode candidates, cheapest first
    # Fetch instead of recompute: the decode worker pulls this worker's cached prefix blocks.
    fetch_from: WorkerId | None = None
    fetch_tokens: int = 0  # cached tokens the fetch is expected to bring beyond the decode worker's own
    block_hashes: tuple[BlockHash, ...] = field(default=(), compare=False, repr=False)


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


@dataclass(frozen=True, slots=True)
class FetchPlan:
    worker_id: WorkerId
    num_tokens: int
    reason: str


class NoCandidateError(Exception):
    """No worker can take the request; the message says why (unknown model, all draining, ...)."""


class Router:
    def __init__(
        self, config: RouterConfig, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        from controlplane.core.policies import make_routing_policy

        config.validate()
        self._config = config
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self.policy = make_routing_policy(config)

    @property
    def config(self) -> RouterConfig:
        return self._config

    def record(self, decision: RouteDecision) -> None:
        """The request was sent as decided (Route queries are not recorded)."""
        self.policy.on_routed(decision, self._clock())

    def on_kv_stored(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash]) -> None:
        self.policy.on_stored(worker_id, block_hashes)

    def on_worker_removed(self, worker_id: WorkerId) -> None:
        self.policy.on_worker_removed(worker_id)

    def route(self, request: RouteRequest, workers: Sequence[WorkerView], index: CacheIndex) -> RouteDecision:
        num_prompt_tokens = len(request.prompt_token_ids)
        if num_prompt_tokens == 0:
            raise ValueError("cannot route an empty prompt: prompt_token_ids has no tokens")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {request.max_tokens}")

        model_workers = _model_workers(request.model, workers)
        block_size = model_workers[0].block_size
        block_hashes = hash_blocks(
            request.prompt_token_ids, block_size, model_salt=request.model, tenant_salt=request.cache_salt
        )
        now = self._clock()
        worker_to_overlap = self.policy.overlaps(index, block_hashes, now)
        ctx = RouteContext(request, num_prompt_tokens, block_size, block_hashes, worker_to_overlap, index, now)

        def cost_of(worker: WorkerView) -> CandidateCost:
            return overlap_cost(self._config, worker, num_prompt_tokens, worker_to_overlap.get(worker.worker_id))

        decode_workers = _decode_candidates(request, model_workers)
        decode_costs = sorted(self.policy.costs(ctx, decode_workers), key=lambda c: (c.cost, c.worker_id))
        decode = self._pick(decode_costs, prefer=lambda c: 0)

        prefill_workers = [
            w
            for w in model_workers
            if w.role.can_prefill and w.active and w.worker_id != decode.worker_id
            and num_prompt_tokens <= w.max_context
        ]
        prefill_worker, reason = self._place_prefill(request, decode, prefill_workers, cost_of)
        fetch = None
        if prefill_worker is None and request.disagg is not DisaggMode.NEVER:
            sources = [w for w in model_workers if w.active and w.worker_id != decode.worker_id]
            by_id = {w.worker_id: w for w in decode_workers}
            fetch = self.policy.fetch(ctx, by_id[decode.worker_id], decode, sources)
        return RouteDecision(
            decode_worker=decode.worker_id,
            prefill_worker=prefill_worker,
            disaggregated=prefill_worker is not None,
            reason=fetch.reason if fetch else reason,
            prompt_tokens=num_prompt_tokens,
            cached_tokens=decode.cached_tokens,
            candidates=tuple(decode_costs),
            fetch_from=fetch.worker_id if fetch else None,
            fetch_tokens=fetch.num_tokens if fetch else 0,
            block_hashes=tuple(block_hashes),
        )

    def _place_prefill(
        self,
        request: RouteRequest,
        decode: CandidateCost,
        prefill_workers: list[WorkerView],
        cost_of: Callable[[WorkerView], CandidateCost],
    ) -> tuple[WorkerId | None, str]:
        """(prefill worker or None for local prefill, the reason in one sentence)."""
        if request.disagg is DisaggMode.NEVER:
            return None, "local prefill: disaggregation disabled for this request (never)"
        if request.disagg is DisaggMode.ALWAYS:
            if not prefill_workers:
                raise NoCandidateError(
                    f"disaggregation 'always' requested but no active prefill worker for model "
                    f"{request.model!r} other than decode worker {decode.worker_id!r} is available; "
                    "add a prefill worker or use disagg 'auto'"
                )
            return self._pick_prefill(prefill_workers, cost_of), "remote prefill: disaggregation requested (always)"

        uncached, threshold = decode.prefill_tokens, self._config.disagg_threshold_tokens
        if uncached < threshold:
            return None, f"local prefill: {uncached} uncached tokens < threshold {threshold}"
        if not prefill_workers:
            return None, (
                f"local prefill: {uncached} uncached tokens >= threshold {threshold} "
                "but no other active prefill worker"
            )
        limit = self._config.max_prefill_queue_tokens
        idle_workers = [w for w in prefill_workers if w.load.num_queued_prefill_tokens < limit]
        if not idle_workers:
            return None, (
                f"local prefill: {uncached} uncached tokens >= threshold {threshold} but all "
                f"{len(prefill_workers)} prefill workers are busy (>= {limit} queued prefill tokens)"
            )
        return self._pick_prefill(idle_workers, cost_of), f"remote prefill: {uncached} uncached tokens >= threshold {threshold}"

    def _pick_prefill(
        self, prefill_workers: list[WorkerView], cost_of: Callable[[WorkerView], CandidateCost]
    ) -> WorkerId:
        id_to_role = {w.worker_id: w.role for w in prefill_workers}
        costs = sorted((cost_of(w) for w in prefill_workers), key=lambda c: (c.cost, c.worker_id))
        # A dedicated prefill worker before a mixed one at equal cost: prefill on a BOTH worker
        # stalls the decodes it runs.
        return self._pick(costs, prefer=lambda c: 0 if id_to_role[c.worker_id] is Role.PREFILL else 1).worker_id

    def _pick(self, costs: list[CandidateCost], prefer: Callable[[CandidateCost], int]) -> CandidateCost:
        """Argmin (ties: lowest `prefer`, then the rng) or, with temperature, a softmax draw.

        `costs` must be sorted by worker id within equal cost so a seeded rng is reproducible.
        """
        if self._config.temperature > 0:
            lowest = min(c.cost for c in costs)
            weights = [math.exp(-(c.cost - lowest) / self._config.temperature) for c in costs]
            return self._rng.choices(costs, weights=weights)[0]
        lowest = costs[0].cost
        tied = [c for c in costs if c.cost - lowest <= _COST_TIE_EPSILON]
        best_rank = min(prefer(c) for c in tied)
        return self._rng.choice([c for c in tied if prefer(c) == best_rank])


def overlap_cost(
    config: RouterConfig,
    worker: WorkerView,
    num_prompt_tokens: int,
    overlap: OverlapScore | None,
    credit_scale: float = 1.0,
    note_suffix: str = "",
    queued_discount_blocks: int = 0,
) -> CandidateCost:
    """Dynamo's cost of one candidate; credit_scale < 1 shrinks its cache credit (the load guard);
    queued_discount_blocks leaves out queued prefill work that computes blocks this request reuses."""
    block_size = worker.block_size
    num_matched_blocks = overlap.num_blocks if overlap else 0
    credit = (
        sum(config.tier_weight(tier) * n for tier, n in overlap.blocks_by_tier.items()) if overlap else 0.0
    ) * credit_scale
    num_prompt_blocks = math.ceil(num_prompt_tokens / block_size)
    num_queued_blocks = max(math.ceil(worker.load.num_queued_prefill_tokens / block_size) - queued_discount_blocks, 0)
    num_used_blocks = worker.load.num_used_blocks
    cost = config.prefill_load_scale * max(num_queued_blocks + num_prompt_blocks - credit, 0.0) + num_used_blocks
    cached_tokens = cached_prefix_tokens(num_matched_blocks, num_prompt_tokens, block_size)
    return CandidateCost(
        worker_id=worker.worker_id,
        cost=cost,
        cached_tokens=cached_tokens,
        prefill_tokens=num_prompt_tokens - cached_tokens,
        note=(
            f"{num_matched_blocks} matched blocks (credit {credit:g}), {num_queued_blocks} queued "
            f"prefill blocks, {num_prompt_blocks} prompt blocks, {num_used_blocks} used blocks"
            f"{note_suffix}"
        ),
    )


def cached_prefix_tokens(num_matched_blocks: int, num_prompt_tokens: int, block_size: int) -> int:
    """The engine always computes at least the last prompt token, so a fully cached prompt still
    gives up its last block."""
    return min(num_matched_blocks, (num_prompt_tokens - 1) // block_size) * block_size


def _model_workers(model: str, workers: Sequence[WorkerView]) -> list[WorkerView]:
    model_workers = [w for w in workers if w.model == model]
    if not model_workers:
        served = sorted({w.model for w in workers})
        known = f"registered workers serve {served}" if served else "no workers are registered"
        raise NoCandidateError(f"no worker serves model {model!r}; {known}")
    block_sizes = sorted({w.block_size for w in model_workers})
    if len(block_sizes) > 1:
        raise NoCandidateError(
            f"workers of model {model!r} disagree on block_size {block_sizes}; they must share one "
            "block size so their block hashes match (fix the workers' engine configuration)"
        )
    return model_workers


def _decode_candidates(request: RouteRequest, model_workers: list[WorkerView]) -> list[WorkerView]:
    decoders = [w for w in model_workers if w.role.can_decode]
    if not decoders:
        raise NoCandidateError(
            f"no decode-capable worker for model {request.model!r} "
            f"({len(model_workers)} prefill-only workers registered)"
        )
    active = [w for w in decoders if w.active]
    if not active:
        raise NoCandidateError(f"all {len(decoders)} decode workers for model {request.model!r} are draining")
    num_needed = len(request.prompt_token_ids) + request.max_tokens
    fitting = [w for w in active if num_needed <= w.max_context]
    if not fitting:
        largest = max(w.max_context for w in active)
        raise NoCandidateError(
            f"prompt of {len(request.prompt_token_ids)} tokens + max_tokens {request.max_tokens} = "
            f"{num_needed} exceeds max_context of every active decode worker for model "
            f"{request.model!r} (largest {largest}); shorten the prompt or lower max_tokens"
        )
    return fitting
