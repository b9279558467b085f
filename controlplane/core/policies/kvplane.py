"""Policy `kvplane` (the default): every candidate priced in predicted seconds, from the step-time
model each worker publishes (the one admission predicts with), and the pick against the request's
objectives. The rule, its predictions and its tie and hot-prefix handling: core/seconds.py.

- Decode worker, prefill placement (local, remote on a prefill worker, or a fetch of a cached
  prefix from another worker) are chosen together: per candidate the placement with the least
  predicted TTFT, then the candidate that meets the objectives with the least TTFT + the compute
  its prefill adds (seconds.choose).
- Predicted prefixes (predictions.PrefixPredictions): each routed prompt counts as cached on its
  worker(s) for prediction_ttl_s, until its real KV events replace it, so a burst sharing a new
  prefix lands where it is being computed (it waits for the queue there, which the prediction
  counts, instead of recomputing the prefix elsewhere).
Parameters: KvplaneParams below (the link rate and calibration come from the planner).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from kvplane.controlplane.core import seconds
from kvplane.controlplane.core.cost import CostConfig, Priced
from kvplane.controlplane.core.index import CacheIndex, OverlapScore
from kvplane.controlplane.core.params import check_numbers, param
from kvplane.controlplane.core.pool import WorkerPool
from kvplane.controlplane.core.predictions import PrefixPredictions
from kvplane.controlplane.core.routing import FetchPlan, Placement, RouteContext, RouteDecision, RoutingPolicy
from kvplane.controlplane.core.settings import DEFAULT_OBJECTIVES
from kvplane.controlplane.core.views import WorkerView
from kvplane.types import BlockHash, DisaggMode, Objective, WorkerId


@dataclass(frozen=True, slots=True)
class KvplaneParams:
    name: ClassVar[str] = "kvplane"
    prediction_ttl_s: float = param(5.0, "seconds a routed prefix counts as cached before its KV events arrive", flag="--prediction-ttl")
    # Moving KV (docs/benchmarks.md, `kvplane bench tiers` and `bench transfer`); the network's
    # rate is the planner's, learnt from measured transfers.
    fetch_overhead_ms: float = param(6.0, "fixed cost of one KV pull of a cached prefix (RPCs, pinning), ms")
    host_load_gb_per_s: float = param(25.0, "rate of loading cached KV blocks from host memory into the device, GB/s")
    disk_load_gb_per_s: float = param(3.0, "rate of loading cached KV blocks from disk into the device, GB/s")
    prefill_tokens_per_s: float = param(
        20000.0, "prefill rate assumed for a worker without a step-time model when none of its peers has one"
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_numbers(self, positive=("host_load_gb_per_s", "disk_load_gb_per_s", "prefill_tokens_per_s"))


class KvplanePolicy(RoutingPolicy):
    def __init__(self, params: KvplaneParams, cost: CostConfig) -> None:
        self._params = params
        self._cost = cost  # prices only the Protocol's `costs` (a caller without placement)
        self.predictions = PrefixPredictions(params.prediction_ttl_s)
        self._fleet = seconds.FleetColumns()  # what does not depend on the request, from one to the next

    def overlaps(
        self, index: CacheIndex, block_hashes: Sequence[BlockHash], now: float, cached: Mapping[WorkerId, OverlapScore]
    ) -> Mapping[WorkerId, OverlapScore]:
        return self.predictions.overlaps(index, block_hashes, now, cached)

    def costs(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> Priced:
        """Predicted TTFT seconds of each worker prefilling locally (what `place` compares first)."""
        pool = WorkerPool.of(workers)
        none = WorkerPool(pool.table, pool.rows[:0])
        placed = self._price(ctx, pool, none, none, limit=0)
        return _as_priced(placed, ctx, np.arange(len(pool)), None)

    def _rates(self, ctx: RouteContext) -> seconds.Rates:
        p = self._params
        return seconds.Rates(
            link_bytes_per_s=ctx.link_bytes_per_s,
            fetch_overhead_s=p.fetch_overhead_ms / 1000,
            host_bytes_per_s=p.host_load_gb_per_s * 1e9,
            disk_bytes_per_s=p.disk_load_gb_per_s * 1e9,
            fallback_prefill_tokens_per_s=p.prefill_tokens_per_s,
        )

    def _price(self, ctx: RouteContext, decode: WorkerPool, sources: WorkerPool, prefill: WorkerPool, limit: int) -> seconds.Priced:
        disagg, objective = ctx.request.disagg, ctx.objective
        share_of = objective or DEFAULT_OBJECTIVES["interactive"]  # the default's weights where none is given
        req = seconds.Request(
            ctx.num_prompt_tokens,
            ctx.request.max_tokens,
            ctx.block_size,
            allow_local=disagg is not DisaggMode.ALWAYS,
            allow_remote=disagg is not DisaggMode.NEVER,
            batch_share=seconds.batch_share_of(share_of.ttft_ms / 1000, share_of.tpot_ms / 1000, ctx.request.max_tokens),
            ttft_target_s=objective.ttft_ms / 1000 if objective else math.inf,
            tpot_target_s=objective.tpot_ms / 1000 if objective else math.inf,
        )
        return seconds.price_candidates(
            req,
            decode,
            ctx.overlaps,
            ctx.cached,
            sources,
            prefill,
            self._rates(ctx),
            ctx.offsets,
            limit,
            self._fleet,
            ctx.prefill_inflow,
        )

    def place(
        self,
        ctx: RouteContext,
        decode: WorkerPool,
        prefill: WorkerPool,
        sources: Callable[[], WorkerPool],
        rng: random.Random,
    ) -> Placement:
        placed = self._price(ctx, decode, sources(), prefill, ctx.max_uncached_candidates)
        if not np.isfinite(placed.ttft).any():
            return None  # no placement the request allows (disagg always, no prefill worker): the router says why
        table = placed.pool.table
        n = len(table.views)
        # The draw among equal seconds: one rotation of the worker-id order (seeded, O(1) draws).
        tie_rank = (table.id_rank[placed.pool.rows] + rng.randrange(n)) % n
        objective = ctx.objective
        inflow = ctx.prefill_inflow
        order = seconds.choose(
            placed,
            objective.ttft_ms / 1000 if objective else None,
            objective.tpot_ms / 1000 if objective else None,
            tie_rank,
            inflow.rates[placed.pool.rows] if inflow is not None else None,
        )
        candidates = _as_priced(placed, ctx, order, objective)
        chosen = candidates[0]
        ids = table.worker_ids
        how = placed.placed(int(order[0]))
        prefill_worker = fetch = None
        if how.placement == seconds.REMOTE:
            prefill_worker = ids[how.prefill_row]
        elif how.placement == seconds.FETCH:
            source = ids[how.source_row]
            num_tokens = how.fetch_blocks * ctx.block_size
            reason = f"fetch: {num_tokens} cached prefix tokens from {source}; {chosen.note}"
            fetch = FetchPlan(worker_id=source, num_tokens=num_tokens, reason=reason, seconds=how.move_s)
        return Placement(candidates, prefill_worker, fetch, f"{chosen.worker_id}: {chosen.note}")

    # -- hooks -----------------------------------------------------------------------------------
    def on_routed(self, decision: RouteDecision, now: float) -> None:
        # Predicted only where the prompt is computed: a fetched prefix, or the KV of a remote
        # prefill, is usable on the decode worker only once it lands (its KV events say so), and a
        # reader sent there before computes it again and holds the step the remote request's first
        # token needs.
        if decision.prefill_worker is not None:
            self.predictions.record(decision.prefill_worker, decision.block_hashes, now)
        elif decision.fetch_from is None:
            self.predictions.record(decision.decode_worker, decision.block_hashes, now)

    def on_stored(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash]) -> None:
        self.predictions.confirm(worker_id, block_hashes)

    def on_worker_removed(self, worker_id: WorkerId) -> None:
        self.predictions.forget_worker(worker_id)


def _as_priced(placed: seconds.Priced, ctx: RouteContext, order: np.ndarray, objective: Objective | None) -> Priced:
    """The candidates in `order` as cost.Priced (cost: predicted TTFT seconds), each with its
    breakdown formatted only when read."""
    p = placed
    rows = p.pool.rows[order]
    ids = p.pool.table.worker_ids

    def detail(k: int) -> seconds.SecondsBreakdown:
        i = int(order[k])
        how = p.placed(i)
        if how.placement == seconds.REMOTE:
            where = f"remote prefill on {ids[how.prefill_row]}"
        elif how.placement == seconds.FETCH:
            where = f"fetch {how.fetch_blocks} blocks from {ids[how.source_row]}"
        else:
            where = "local prefill"
        meets = None
        if objective is not None:
            meets = bool(p.ttft[i] * 1000 <= objective.ttft_ms and p.tpot[i] * 1000 <= objective.tpot_ms)
        return seconds.SecondsBreakdown(
            where, how.queue_s, how.move_s, how.prefill_s, how.transfer_s, float(p.ttft[i]), float(p.tpot[i]), meets, float(p.work[i])
        )

    cached = p.cached_tokens[order]
    return Priced(list(map(ids.__getitem__, rows.tolist())), rows, p.ttft[order], cached, ctx.num_prompt_tokens - cached, detail)
