"""Policy `llm-d` (peer): the llm-d inference scheduler's default scoring profile.

Follows llm-d/llm-d-inference-scheduler pkg/epp/config/loader/defaults.go (commit 159e739b,
2026: queue-scorer weight 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3, max-score
picker), the scorers' READMEs under pkg/epp/framework/plugins/scheduling/scorer/, and the
approximate prefix producer pkg/epp/framework/plugins/requestcontrol/dataproducer/
approximateprefix/plugin.go (commit d04c61e9). Per candidate, every score in [0, 1]:

    queue  = (max_q - q) / (max_q - min_q) over the candidates (1 for all when they are equal)
    kv     = 1 - KV-cache usage
    prefix = matched blocks / prompt blocks (at most max_prefix_blocks of them)
    score  = 2 x queue + 2 x kv + 3 x prefix

The highest score wins (cost = -score); ties are drawn at random (the max-score picker shuffles
the candidates first; the Router's seeded draw here).

Inputs from what the planner has, and where they differ:
- q: the worker's waiting requests (vLLM's num_requests_waiting), from its report corrected for
  what this control plane routed since (llm-d scrapes the metric, so it lags more);
- KV usage: used / total blocks from the report (vLLM's kv_cache_usage_perc);
- matched blocks: a routed_cache.RoutedCache, the approximate producer's index: each routed
  prompt's blocks recorded on the decode worker and, when disaggregated, the prefill worker, in
  a per-worker LRU of lru_capacity_blocks (0 = autotune: the worker's KV blocks, as the producer
  reads CacheNumBlocks). The producer counts, per worker, each leading block it is believed to
  hold until a block nobody holds; here a worker's count stops at its first missing block (they
  differ only when an LRU evicted a prompt's head before its tail). It also hashes blocks of at
  least 64 tokens (its minBlockSizeTokens); here the engine's blocks, so the ratio is finer.
Parameters: LlmDParams below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvplane.controlplane.core.cost import CostConfig, cached_prefix_tokens
from kvplane.controlplane.core.params import check_numbers, param
from kvplane.controlplane.core.policies.routed_cache import RoutedCache
from kvplane.controlplane.core.routing import CandidateCost, RouteContext, RouteDecision, RoutingPolicy
from kvplane.controlplane.core.views import WorkerView
from kvplane.types import WorkerId

# The producer's capacity per worker when autotune finds no block count (DefaultLRUCapacityPerServer).
DEFAULT_LRU_CAPACITY_BLOCKS = 31250


@dataclass(frozen=True, slots=True)
class LlmDParams:
    name: ClassVar[str] = "llm-d"
    llmd_queue_weight: float = param(2.0, "weight of the queue-depth score")
    llmd_kv_weight: float = param(2.0, "weight of the KV-cache-utilization score")
    llmd_prefix_weight: float = param(3.0, "weight of the prefix-cache score")
    llmd_max_prefix_blocks: int = param(256, "prompt blocks the prefix score considers")
    llmd_lru_capacity_blocks: int = param(0, "blocks the approximate prefix index keeps per worker (0 = the worker's KV blocks)")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_numbers(self, integers=("llmd_max_prefix_blocks", "llmd_lru_capacity_blocks"), positive=("llmd_max_prefix_blocks",))


@dataclass(frozen=True, slots=True)
class LlmDScore:
    queue: float
    kv: float
    prefix: float
    total: float

    def __str__(self) -> str:
        return f"score {self.total:.3f} = queue {self.queue:.3f}, kv {self.kv:.3f}, prefix {self.prefix:.3f} (weighted)"


class LlmDPolicy(RoutingPolicy):
    def __init__(self, params: LlmDParams, cost: CostConfig) -> None:
        del cost  # scores, not costs
        self._params = params
        self.index = RoutedCache()
        self._capacity: dict[WorkerId, int] = {}

    def scores(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[LlmDScore]:
        p = self._params
        waiting = [w.load.num_waiting for w in workers]
        low, high = min(waiting), max(waiting)
        hashes = ctx.block_hashes[: p.llmd_max_prefix_blocks]
        believed = self.index.overlaps(hashes)
        out = []
        for w, q in zip(workers, waiting):
            queue = 1.0 if high == low else (high - q) / (high - low)
            total = w.load.num_total_blocks
            kv = 1.0 - (w.load.num_used_blocks / total if total else 0.0)
            match = believed.get(w.worker_id)
            prefix = match.num_blocks / len(hashes) if match and hashes else 0.0
            score = p.llmd_queue_weight * queue + p.llmd_kv_weight * kv + p.llmd_prefix_weight * prefix
            out.append(LlmDScore(queue, kv, prefix, score))
        return out

    def costs(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[CandidateCost]:
        workers = list(workers)
        cap = self._params.llmd_lru_capacity_blocks
        for w in workers:
            self._capacity[w.worker_id] = cap or w.load.num_total_blocks or DEFAULT_LRU_CAPACITY_BLOCKS
        out = []
        for w, s in zip(workers, self.scores(ctx, workers)):
            overlap = ctx.overlaps.get(w.worker_id)
            cached = cached_prefix_tokens(overlap.num_blocks if overlap else 0, ctx.num_prompt_tokens, ctx.block_size)
            out.append(CandidateCost(w.worker_id, -s.total, cached, ctx.num_prompt_tokens - cached, s))
        return out

    def on_routed(self, decision: RouteDecision, now: float) -> None:
        hashes = decision.block_hashes[: self._params.llmd_max_prefix_blocks]
        for worker_id in (decision.decode_worker, decision.prefill_worker):
            if worker_id is not None:
                default = self._params.llmd_lru_capacity_blocks or DEFAULT_LRU_CAPACITY_BLOCKS
                self.index.record(worker_id, hashes, self._capacity.get(worker_id, default))

    def on_worker_removed(self, worker_id: WorkerId) -> None:
        self.index.forget_worker(worker_id)
        self._capacity.pop(worker_id, None)
