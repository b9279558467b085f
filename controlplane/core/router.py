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

Which decode worker wins is the routing policy's call (controlplane/core/policies/). The
default, kvplane, places the whole request itself (the `place` hook): decode worker, local or
remote prefill and a fetch, all priced in predicted seconds (core/seconds.py); the cost, the
threshold and the prefill choice above are for the policies that price by a cost (round-robin,
least-load and prefix-only as baselines), whose prefill worker is chosen by the cost above
(controlplane/core/cost.py).

Parameters: RouterConfig below (the policy's own in its params dataclass, the cost's in
cost.CostConfig), the single source of their defaults.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvplane.block_hash import CachedBlockHasher
from kvplane.controlplane.core.cost import CostConfig, Priced, cheapest_uncached, price
from kvplane.controlplane.core.index import CacheIndex, OverlapScore
from kvplane.controlplane.core.inflow import Inflow
from kvplane.controlplane.core.params import check_numbers, param, selector
from kvplane.controlplane.core.policies import check_params, default_params, make_routing_policy, params_types
from kvplane.controlplane.core.pool import WorkerPool
from kvplane.controlplane.core.routing import (
    CandidateCost,
    NoCandidateError,
    NoPrefillWorkerError,
    RouteContext,
    RouteDecision,
    RouteRequest,
    RoutingPolicyParams,
)
from kvplane.controlplane.core.views import WorkerView
from kvplane.types import BlockHash, DisaggMode, Objective, WorkerId

# Costs closer than this are a tie: tier weights are fractions, and float sums of the same
# credit in a different order must not decide the route.
_COST_TIE_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class RouterConfig:
    # Which decode worker wins: the params of one registered policy (controlplane/core/policies/).
    policy: RoutingPolicyParams = selector(
        default_params, "which decode worker takes a request", flag="--routing-policy", params_types=params_types
    )
    cost: CostConfig = field(default_factory=CostConfig)
    disagg_threshold_tokens: int = param(
        2048,
        "policies that price by a cost: remote prefill only when a prompt's uncached tokens reach this (kvplane decides in seconds)",
        flag="--disagg-threshold",
    )
    max_prefill_queue_tokens: int = param(
        16384, "policies that price by a cost: a prefill worker with this many queued prefill tokens or more is busy: prefill locally"
    )
    temperature: float = param(
        0.0, "policies that price by a cost: 0 = the cheapest worker wins; > 0 samples over softmax(-cost / temperature)"
    )
    max_uncached_candidates: int = param(
        16,
        "of the workers holding none of a prompt, price in full only this many with the least load (kvplane: by each of its "
        "measures, core/seconds.py) and those tied with them (0 = all); they are the ones that can win",
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_params(self.policy)
        self.cost.validate()
        check_numbers(self, integers=("disagg_threshold_tokens", "max_prefill_queue_tokens", "max_uncached_candidates"))
        if self.max_prefill_queue_tokens == 0:
            raise ValueError("RouterConfig.max_prefill_queue_tokens must be > 0, or every prefill worker counts as busy")

    @property
    def policy_name(self) -> str:
        return self.policy.name


class Router:
    """Routes with the configured policy. `now` (seconds, any monotonic origin) is passed in,
    and the random draw comes from `rng`, so a run is reproducible."""

    def __init__(self, config: RouterConfig, rng: random.Random | None = None) -> None:
        config.validate()
        self._config = config
        self._rng = rng if rng is not None else random.Random()
        self.policy = make_routing_policy(config.policy, config.cost)
        self._hasher = CachedBlockHasher()

    @property
    def config(self) -> RouterConfig:
        return self._config

    def record(self, decision: RouteDecision, now: float) -> None:
        """The request was sent as decided (Route queries are not recorded)."""
        self.policy.on_routed(decision, now)

    def on_kv_stored(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash]) -> None:
        self.policy.on_stored(worker_id, block_hashes)

    def on_worker_removed(self, worker_id: WorkerId) -> None:
        self.policy.on_worker_removed(worker_id)

    def route(
        self,
        request: RouteRequest,
        workers: Sequence[WorkerView],
        index: CacheIndex,
        now: float,
        *,
        objective: Objective | None = None,
        link_bytes_per_s: float = 1e9,
        offsets: tuple[float, float, float] = (0.0, 0.0, 0.0),
        prefill_inflow: Inflow | None = None,
    ) -> RouteDecision:
        """`objective`, `link_bytes_per_s`, `offsets`, `prefill_inflow`: what a policy pricing in
        seconds compares against (the planner's objective, measured link rate, calibration and
        prefill inflow per row of `workers`' table)."""
        num_prompt_tokens = len(request.prompt_token_ids)
        if num_prompt_tokens == 0:
            raise ValueError("cannot route an empty prompt: prompt_token_ids has no tokens")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {request.max_tokens}")

        pool = WorkerPool.of(workers)
        table = pool.table
        model_workers = _model_workers(request.model, pool)
        block_size = model_workers[0].block_size
        block_hashes = self._hasher.hash_blocks(
            request.prompt_token_ids, block_size, model_salt=request.model, tenant_salt=request.cache_salt
        )
        cached = index.overlaps(block_hashes)  # the one walk of the index: policies and the planner share it
        worker_to_overlap = self.policy.overlaps(index, block_hashes, now, cached)
        limit = self._config.max_uncached_candidates if self._config.temperature == 0 else 0  # a softmax draw needs every worker
        ctx = RouteContext(
            request, num_prompt_tokens, block_size, block_hashes, worker_to_overlap, index, now, limit, cached,
            objective, link_bytes_per_s, offsets, prefill_inflow,
        )  # fmt: skip

        decode_workers = _decode_candidates(request, model_workers)
        placed = self._place(ctx, request, model_workers, decode_workers)
        if placed is not None:
            return placed
        decode_costs = Priced.of(self.policy.costs(ctx, decode_workers), table).ranked(table)
        decode = self._pick(decode_costs)
        decode_view = decode_workers.get(decode.worker_id)
        assert decode_view is not None  # a policy prices only the workers it is given

        prefill_workers = model_workers.where(
            table.serving(request.model, "prefill") & (table.max_context >= num_prompt_tokens) & table.kv_mask(decode_view)
        ).without(decode.worker_id)
        prefill_worker, reason = self._place_prefill(request, decode, prefill_workers, worker_to_overlap, limit)
        fetch = None
        if prefill_worker is None and request.disagg is not DisaggMode.NEVER:

            def sources() -> WorkerPool:
                kv_from = table.serving(request.model, "active") & table.kv_mask(decode_view, cached_blocks=True)
                return model_workers.where(kv_from).without(decode.worker_id)

            fetch = self.policy.fetch(ctx, decode_view, decode, sources)
        return RouteDecision(
            decode_worker=decode.worker_id,
            prefill_worker=prefill_worker,
            disaggregated=prefill_worker is not None,
            reason=fetch.reason if fetch else reason,
            prompt_tokens=num_prompt_tokens,
            cached_tokens=decode.cached_tokens,
            candidates=decode_costs,
            fetch_from=fetch.worker_id if fetch else None,
            fetch_tokens=fetch.num_tokens if fetch else 0,
            block_hashes=tuple(block_hashes),
            index_overlaps=cached,
        )

    def _place(
        self, ctx: RouteContext, request: RouteRequest, model_workers: WorkerPool, decode_workers: WorkerPool
    ) -> RouteDecision | None:
        """The policy's own whole placement (the `place` hook), when it makes one."""
        table = model_workers.table
        num_prompt_tokens = ctx.num_prompt_tokens
        prefill_workers = model_workers.where(table.serving(request.model, "prefill") & (table.max_context >= num_prompt_tokens))

        def sources() -> WorkerPool:
            return model_workers.where(table.serving(request.model, "active"))

        placement = self.policy.place(ctx, decode_workers, prefill_workers, sources, self._rng)
        if placement is None:
            return None
        decode = placement.candidates[0]
        fetch = placement.fetch
        return RouteDecision(
            decode_worker=decode.worker_id,
            prefill_worker=placement.prefill_worker,
            disaggregated=placement.prefill_worker is not None,
            reason=placement.reason,
            prompt_tokens=num_prompt_tokens,
            cached_tokens=decode.cached_tokens,
            candidates=placement.candidates,
            fetch_from=fetch.worker_id if fetch else None,
            fetch_tokens=fetch.num_tokens if fetch else 0,
            fetch_s=fetch.seconds if fetch else 0.0,
            block_hashes=tuple(ctx.block_hashes),
            index_overlaps=ctx.cached,
            policy_overlaps=ctx.overlaps,
        )

    def _place_prefill(
        self,
        request: RouteRequest,
        decode: CandidateCost,
        prefill_workers: WorkerPool,
        overlaps: Mapping[WorkerId, OverlapScore],
        max_uncached: int,
    ) -> tuple[WorkerId | None, str]:
        """(prefill worker or None for local prefill, the reason in one sentence). Prefill workers
        holding none of the prompt are priced only up to `max_uncached` with the least load."""

        def pick(workers: WorkerPool) -> WorkerId:
            holders, rest = workers.split(overlaps)
            candidates = holders.union(cheapest_uncached(self._config.cost, rest, max_uncached))
            costs = price(self._config.cost, candidates, len(request.prompt_token_ids), overlaps).ranked(candidates.table)
            # A dedicated prefill worker before a mixed one at equal cost: prefill on a BOTH worker
            # stalls the decodes it runs (of prefill-capable workers, PREFILL is the one that cannot decode).
            return self._pick(costs, prefer=candidates.table.can_decode[costs.rows].astype(np.int64)).worker_id

        if request.disagg is DisaggMode.NEVER:
            return None, "local prefill: disaggregation disabled for this request (never)"
        if request.disagg is DisaggMode.ALWAYS:
            if not prefill_workers:
                raise NoPrefillWorkerError(
                    f"disaggregation 'always' requested but no active prefill worker for model "
                    f"{request.model!r} other than decode worker {decode.worker_id!r} is available (one sharing a KV transport with it); "
                    "add a prefill worker or use disagg 'auto'"
                )
            return pick(prefill_workers), "remote prefill: disaggregation requested (always)"

        uncached, threshold = decode.prefill_tokens, self._config.disagg_threshold_tokens
        if uncached < threshold:
            return None, f"local prefill: {uncached} uncached tokens < threshold {threshold}"
        if not prefill_workers:
            return None, (f"local prefill: {uncached} uncached tokens >= threshold {threshold} but no other active prefill worker")
        limit = self._config.max_prefill_queue_tokens
        idle_workers = prefill_workers.where(prefill_workers.table.queued < limit)
        if not idle_workers:
            return None, (
                f"local prefill: {uncached} uncached tokens >= threshold {threshold} but all "
                f"{len(prefill_workers)} prefill workers are busy (>= {limit} queued prefill tokens)"
            )
        return pick(idle_workers), f"remote prefill: {uncached} uncached tokens >= threshold {threshold}"

    def _pick(self, costs: Priced, prefer: np.ndarray | None = None) -> CandidateCost:
        """Argmin (ties: lowest `prefer`, then the rng) or, with temperature, a softmax draw.

        `costs` must be ranked (by cost, then worker id) so that a seeded rng is reproducible.
        """
        if self._config.temperature > 0:
            listed = list(costs)
            lowest = min(c.cost for c in listed)
            weights = [math.exp(-(c.cost - lowest) / self._config.temperature) for c in listed]
            return self._rng.choices(listed, weights=weights)[0]
        cost = costs.cost
        with np.errstate(invalid="ignore"):  # inf - inf is NaN: equal infinite costs are tied by ==
            if len(cost) == 1 or cost[1] - cost[0] > _COST_TIE_EPSILON:  # the usual case: one cheapest
                return costs[int(self._rng.choice((0,)))]  # the same draw as among ties, so a seeded run stays the same
            tied = np.flatnonzero((cost - cost[0] <= _COST_TIE_EPSILON) | (cost == cost[0]))
        if not len(tied):  # no cost is a number (NaN ranks last, so all are NaN): all are alike
            tied = np.arange(len(cost))
        if prefer is not None:
            ranks = prefer[tied]
            tied = tied[ranks == ranks.min()]
        return costs[int(self._rng.choice(tied.tolist()))]


def _model_workers(model: str, workers: WorkerPool) -> WorkerPool:
    table = workers.table
    model_workers = workers.where(table.serving(model))
    if not model_workers:
        served = sorted({w.model for w in workers})
        known = f"registered workers serve {served}" if served else "no workers are registered"
        raise NoCandidateError(f"no worker serves model {model!r}; {known}")
    # One block size among all the model's workers (the common case, known once per set of
    # workers) means one among these; otherwise look at these.
    if len(table.fixed(("block sizes", model), lambda: set(table.block_size[table.serving(model)].tolist()))) > 1:
        block_sizes = sorted(set(model_workers.column("block_size").tolist()))
    else:
        block_sizes = [model_workers[0].block_size]
    if len(block_sizes) > 1:
        raise NoCandidateError(
            f"workers of model {model!r} disagree on block_size {block_sizes}; they must share one "
            "block size so their block hashes match (fix the workers' engine configuration)"
        )
    return model_workers


def _decode_candidates(request: RouteRequest, model_workers: WorkerPool) -> WorkerPool:
    table = model_workers.table
    num_needed = len(request.prompt_token_ids) + request.max_tokens
    fitting = model_workers.where(table.serving(request.model, "decode") & (table.max_context >= num_needed))
    if fitting:
        return fitting
    # None: say why.
    decoders = model_workers.where(table.can_decode)
    if not decoders:
        raise NoCandidateError(
            f"no decode-capable worker for model {request.model!r} ({len(model_workers)} prefill-only workers registered)"
        )
    active = decoders.where(table.active)
    if not active:
        raise NoCandidateError(f"all {len(decoders)} decode workers for model {request.model!r} are draining")
    largest = int(active.column("max_context").max())
    raise NoCandidateError(
        f"prompt of {len(request.prompt_token_ids)} tokens + max_tokens {request.max_tokens} = "
        f"{num_needed} exceeds max_context of every active decode worker for model "
        f"{request.model!r} (largest {largest}); shorten the prompt or lower max_tokens"
    )
