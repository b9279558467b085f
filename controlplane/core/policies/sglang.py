"""Policy `sglang` (peer): the SGLang model gateway's `cache_aware` policy with its defaults.

Follows sgl-project/sglang sgl-model-gateway/src/policies/cache_aware.rs (select_worker,
commit b93974f1, 2026: the version whose cache miss goes to the least-loaded worker; older ones
sent it to the smallest tree) with the gateway's command-line defaults (cache_threshold 0.3,
balance_abs_threshold 64, balance_rel_threshold 1.5, max_tree_size 2^26; the Rust-side
CacheAwareConfig::default in policies/mod.rs says 0.5 / 32 / 1.1, but the gateway passes its CLI's):

1. loads = in-flight requests per worker; if max - min > abs_threshold AND max > rel_threshold x
   min, the load is imbalanced: the worker with the fewest in flight wins (the first such in
   worker order: Rust's min_by_key);
2. otherwise the approximate tree's longest match (over all workers) decides: if matched /
   prompt > cache_threshold, the worker holding that match wins (among equal matches the
   gateway's tree returns one arbitrarily: the Router's seeded draw here);
3. otherwise the worker with the fewest in flight wins (first in worker order).
Either way the prompt is then inserted into the chosen worker's branch of the tree.

Inputs from what the planner has, and where they differ:
- in-flight requests: running + waiting on the worker (its report, corrected for what this
  control plane routed since; the gateway counts its own requests from send to completion);
- the tree: a routed_cache.RoutedCache of block hashes (the gateway's tree holds characters
  over HTTP, tokens over gRPC, and matches to the character; here to the block, so a prompt's
  last partial block never matches), capped at max_tree_tokens per worker (the gateway trims
  each worker's branch to max_tree_size every 120 s; at 2^26 tokens that never happens in a run);
- worker order: worker-id order (the gateway's is registration order).
Its cost: 0 for the winner (or the tied winners), 1 for every other worker.
Parameters: SglangParams below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from kvplane.controlplane.core.cost import CostConfig, cached_prefix_tokens
from kvplane.controlplane.core.params import check_numbers, param
from kvplane.controlplane.core.policies.routed_cache import RoutedCache
from kvplane.controlplane.core.pool import WorkerPool
from kvplane.controlplane.core.routing import CandidateCost, RouteContext, RouteDecision, RoutingPolicy
from kvplane.controlplane.core.views import WorkerView
from kvplane.types import WorkerId


@dataclass(frozen=True, slots=True)
class SglangParams:
    name: ClassVar[str] = "sglang"
    sglang_cache_threshold: float = param(0.3, "route to the best prefix match only when matched / prompt exceeds this")
    sglang_balance_abs_threshold: int = param(64, "imbalanced when max - min in-flight requests exceeds this ...")
    sglang_balance_rel_threshold: float = param(1.5, "... and max exceeds this multiple of min")
    sglang_max_tree_tokens: int = param(2**26, "tokens of routed prompts the approximate tree keeps per worker")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_numbers(self, integers=("sglang_balance_abs_threshold", "sglang_max_tree_tokens"))
        if self.sglang_cache_threshold > 1:
            raise ValueError(f"SglangParams.sglang_cache_threshold must be <= 1, got {self.sglang_cache_threshold!r}")


class SglangPolicy(RoutingPolicy):
    def __init__(self, params: SglangParams, cost: CostConfig) -> None:
        del cost  # thresholds, not costs
        self._params = params
        self.tree = RoutedCache()
        self._block_size = 0

    def costs(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[CandidateCost]:
        p = self._params
        self._block_size = ctx.block_size
        pool = WorkerPool.of(workers)
        ids = pool.worker_ids
        loads = pool.column("requests")
        low, high = int(loads.min()), int(loads.max())
        first_least = int(np.lexsort((pool.table.id_rank[pool.rows], loads))[0])
        if high - low > p.sglang_balance_abs_threshold and high > low * p.sglang_balance_rel_threshold:
            winners, why = {ids[first_least]}, f"imbalanced ({high} - {low} in flight): fewest in flight"
        else:
            believed = self.tree.overlaps(ctx.block_hashes)
            best = max((believed[w].num_blocks for w in ids if w in believed), default=0)
            rate = best * ctx.block_size / ctx.num_prompt_tokens
            if rate > p.sglang_cache_threshold:
                winners = {w for w in ids if w in believed and believed[w].num_blocks == best}
                why = f"tree match {rate:.2f} > {p.sglang_cache_threshold:g}: longest match"
            else:
                winners, why = {ids[first_least]}, f"tree match {rate:.2f} <= {p.sglang_cache_threshold:g}: fewest in flight"
        out = []
        for worker_id, load in zip(ids, loads.tolist()):
            overlap = ctx.overlaps.get(worker_id)
            cached = cached_prefix_tokens(overlap.num_blocks if overlap else 0, ctx.num_prompt_tokens, ctx.block_size)
            won = worker_id in winners
            out.append(CandidateCost(worker_id, 0.0 if won else 1.0, cached, ctx.num_prompt_tokens - cached, f"{why}; {load} in flight"))
        return out

    def on_routed(self, decision: RouteDecision, now: float) -> None:
        if self._block_size:
            self.tree.record(decision.decode_worker, decision.block_hashes, self._params.sglang_max_tree_tokens // self._block_size)

    def on_worker_removed(self, worker_id: WorkerId) -> None:
        self.tree.forget_worker(worker_id)
