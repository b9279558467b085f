"""Policy `kvplane`: Dynamo's cost with tier-weighted cache credit, a load guard, predicted
prefixes, and fetch instead of recompute.

- Cost (cost.price): prefill_load_scale x max(queued + prompt blocks - credit, 0)
  + used blocks, credit = sum over the matched prefix of the tier weight of each block.
- Load guard: for each signal s of a candidate (queued prefill tokens incl. just-routed work, KV
  use = (used + pending) / total blocks, running + waiting requests), allowed_s = guard_ratio x mean_s over
  the candidates + slack_s; when s > allowed_s the credit is multiplied by (allowed_s / s) **
  guard_power (the smallest factor over signals). A hot prefix therefore cannot pile every
  request onto its holder (SGLang's balance check, 1.5x, made continuous), and a cache miss,
  having no credit, goes to the least loaded worker by the plain cost, never to the emptiest cache.
- Predicted prefixes (predictions.PrefixPredictions): each routed prompt counts as cached on its
  worker for prediction_ttl_s, until its real KV events replace it; the queued prefill work that is
  computing those predicted blocks is not counted against a request that will reuse them.
- Fetch: when another active worker holds at least fetch_min_blocks more leading device blocks
  than the chosen one (it lost on load) and fetch_overhead_ms + blocks x block bytes /
  fetch_bytes_per_s < blocks x block_size / prefill_tokens_per_s, the chosen worker pulls them.
Parameters: KvplaneParams below (the cost's own: cost.CostConfig).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from kvplane import native
from kvplane.controlplane.core.cost import CostConfig, Priced, cheapest_uncached, price
from kvplane.controlplane.core.index import CacheIndex, OverlapScore
from kvplane.controlplane.core.params import check_numbers, param
from kvplane.controlplane.core.pool import WorkerPool
from kvplane.controlplane.core.predictions import PrefixPredictions
from kvplane.controlplane.core.routing import CandidateCost, FetchPlan, PolicyHooks, RouteContext, RouteDecision
from kvplane.controlplane.core.views import WorkerView
from kvplane.types import BlockHash, Tier, WorkerId


@dataclass(frozen=True, slots=True)
class KvplaneParams:
    name: ClassVar[str] = "kvplane"
    prediction_ttl_s: float = param(5.0, "seconds a routed prefix counts as cached before its KV events arrive", flag="--prediction-ttl")
    guard_ratio: float = param(1.5, "cache credit decays above this multiple of the pool's mean load (0 = off)")
    guard_power: float = param(2.0, "how fast the credit decays above the allowed load: (allowed / value) ** power")
    guard_slack_tokens: int = param(512, "queued prefill tokens allowed above guard_ratio x the pool mean")
    guard_slack_kv_usage: float = param(0.1, "KV use (used / total blocks) allowed above guard_ratio x the pool mean")
    guard_slack_requests: int = param(2, "running + waiting requests allowed above guard_ratio x the pool mean")
    fetch_min_blocks: int = param(4, "fetch a cached prefix from a busier holder when it brings this many more blocks (0 = off)")
    # Rates for the fetch decision: docs/benchmarks.md.
    fetch_bytes_per_s: float = param(7e8, "KV pull rate the fetch decision assumes, bytes per second")
    fetch_overhead_ms: float = param(6.0, "fixed cost of one KV pull the fetch decision assumes")
    prefill_tokens_per_s: float = param(20000.0, "prefill rate the fetch decision compares a pull with")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_numbers(
            self,
            integers=("guard_slack_tokens", "guard_slack_requests", "fetch_min_blocks"),
            positive=("fetch_bytes_per_s", "prefill_tokens_per_s"),
        )


def guard_factors(values: np.ndarray, mean: float, ratio: float, slack: float, power: float) -> np.ndarray:
    """Per value: 1 while value <= ratio x mean + slack, then (allowed / value) ** power."""
    allowed = ratio * mean + slack
    out = np.ones(len(values))
    over = (values > allowed) & (values > 0)
    out[over] = (allowed / values[over]) ** power
    return out


def guard_factor(value: float, mean: float, ratio: float, slack: float, power: float) -> float:
    """guard_factors of one value."""
    return float(guard_factors(np.array([value], np.float64), mean, ratio, slack, power)[0])


def _kv_use(pool: WorkerPool) -> np.ndarray:
    """KV use the guard sees: used blocks plus those of requests routed since the last report,
    over total blocks (0 for a worker that has not reported its pool)."""
    total = pool.column("total")
    return np.divide(pool.column("used") + pool.column("pending"), total, out=np.zeros(len(pool)), where=total > 0)


class KvplanePolicy(PolicyHooks):
    def __init__(self, params: KvplaneParams, cost: CostConfig) -> None:
        self._params = params
        self._cost = cost
        self.predictions = PrefixPredictions(params.prediction_ttl_s)

    # -- scoring ---------------------------------------------------------------------------
    def overlaps(
        self, index: CacheIndex, block_hashes: Sequence[BlockHash], now: float, cached: Mapping[WorkerId, OverlapScore]
    ) -> Mapping[WorkerId, OverlapScore]:
        return self.predictions.overlaps(index, block_hashes, now, cached)

    def costs(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> Priced:
        """Every worker holding part of the prompt (real or predicted) priced in full; of the rest,
        which have no credit for the guard to shrink, the ctx.max_uncached_candidates cheapest.
        Queued work that is computing this prompt's predicted blocks is shared, not added."""
        pool = WorkerPool.of(workers)
        holders, others = pool.split(ctx.overlaps)
        uncached = cheapest_uncached(self._cost, others, ctx.max_uncached_candidates)
        if not holders:
            return price(self._cost, uncached, ctx.num_prompt_tokens)
        # One pricing pass over both (the workers of `uncached` hold nothing: no credit to guard).
        candidates = holders.union(uncached)
        guard = np.ones(len(candidates))
        guard[np.searchsorted(candidates.rows, holders.rows)] = self._guard(pool, holders)
        return price(self._cost, candidates, ctx.num_prompt_tokens, ctx.overlaps, guard, discount_predicted=True)

    def _guard(self, pool: WorkerPool, holders: WorkerPool) -> np.ndarray:
        """The load guard's credit factor of each holder, against the means over `pool`."""
        c = self._params
        n = len(pool)
        if c.guard_ratio == 0 or n < 2:
            return np.ones(len(holders))
        if native.load_guard is not None:  # compiled (kvplane/_native.c): what follows, in one pass
            t, out = pool.table, np.empty(len(holders))
            # Rows as int64 (the pools routing makes have them so already: then no copy).
            pool_rows, holder_rows = np.ascontiguousarray(pool.rows, np.int64), np.ascontiguousarray(holders.rows, np.int64)
            native.load_guard(
                t.queued, t.used, t.pending, t.total, t.requests, pool_rows, holder_rows, out,
                c.guard_ratio, c.guard_power, c.guard_slack_tokens, c.guard_slack_kv_usage, c.guard_slack_requests,
            )  # fmt: skip
            return out
        mean_tokens = int(pool.column("queued").sum()) / n
        mean_kv = float(np.cumsum(_kv_use(pool))[-1]) / n  # summed in order, as a loop over the workers would
        mean_requests = int(pool.column("requests").sum()) / n
        return np.minimum.reduce(
            [
                guard_factors(holders.column("queued").astype(np.float64), mean_tokens, c.guard_ratio, c.guard_slack_tokens, c.guard_power),
                guard_factors(_kv_use(holders), mean_kv, c.guard_ratio, c.guard_slack_kv_usage, c.guard_power),
                guard_factors(
                    holders.column("requests").astype(np.float64), mean_requests, c.guard_ratio, c.guard_slack_requests, c.guard_power
                ),
            ]
        )

    # -- fetch instead of recompute -----------------------------------------------------------
    def fetch(
        self, ctx: RouteContext, decode: WorkerView, decode_cost: CandidateCost, sources: Callable[[], Sequence[WorkerView]]
    ) -> FetchPlan | None:
        c = self._params
        if c.fetch_min_blocks == 0 or not decode.block_nbytes:
            return None
        bs = ctx.block_size
        max_blocks = (ctx.num_prompt_tokens - 1) // bs
        own = decode_cost.cached_tokens // bs
        real = ctx.cached  # predicted blocks do not exist yet
        # The most any worker could bring (most requests stop here, before any pool is made).
        most = max((s.blocks_by_tier.get(Tier.DEVICE, 0) for s in real.values()), default=0)
        if min(most, max_blocks) - own < c.fetch_min_blocks:
            return None
        holders, _ = WorkerPool.of(sources()).split(real)
        if not holders:
            return None
        # Only device blocks can be pinned for a pull without computing; only a worker with the
        # same block layout can send them.
        codes, per = holders.distinct_values(real)
        num_device = np.minimum(np.array([s.blocks_by_tier.get(Tier.DEVICE, 0) for s in per], np.int64)[codes], max_blocks)
        num_device[holders.column("block_nbytes") != decode.block_nbytes] = -1
        i = int(np.argmax(num_device))  # the first in pool order of the most
        if num_device[i] < 0:
            return None
        best = (int(num_device[i]), holders.table.worker_ids[int(holders.rows[i])])
        gain = best[0] - own
        if gain < c.fetch_min_blocks:
            return None
        pull_ms = c.fetch_overhead_ms + gain * decode.block_nbytes / c.fetch_bytes_per_s * 1000
        prefill_ms = gain * bs / c.prefill_tokens_per_s * 1000
        if pull_ms >= prefill_ms:
            return None
        return FetchPlan(
            worker_id=best[1],
            num_tokens=gain * bs,
            reason=(
                f"fetch: {best[1]} holds {gain * bs} more cached prefix tokens but costs more; "
                f"predicted pull {pull_ms:.1f} ms < prefill {prefill_ms:.1f} ms"
            ),
        )

    # -- hooks -----------------------------------------------------------------------------------
    def on_routed(self, decision: RouteDecision, now: float) -> None:
        hashes = decision.block_hashes
        self.predictions.record(decision.decode_worker, hashes, now)
        if decision.prefill_worker is not None:
            self.predictions.record(decision.prefill_worker, hashes, now)

    def on_stored(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash]) -> None:
        self.predictions.confirm(worker_id, block_hashes)

    def on_worker_removed(self, worker_id: WorkerId) -> None:
        self.predictions.forget_worker(worker_id)
