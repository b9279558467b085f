"""Policy `least-load` (baseline): Dynamo's cost with no cache credit, i.e. the candidate with the
least queued prefill work plus prompt plus KV blocks in use wins, whatever it caches.
Parameters: none of its own (cost.CostConfig.prefill_load_scale)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvplane.controlplane.core.cost import CostConfig, cached_prefix_tokens, cheapest_uncached, price
from kvplane.controlplane.core.routing import CandidateCost, RouteContext, RoutingPolicy
from kvplane.controlplane.core.views import WorkerView


@dataclass(frozen=True, slots=True)
class LeastLoadParams:
    name: ClassVar[str] = "least-load"

    def validate(self) -> None:
        pass


class LeastLoadPolicy(RoutingPolicy):
    def __init__(self, params: LeastLoadParams, cost: CostConfig) -> None:
        self._cost = cost

    def costs(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[CandidateCost]:
        out = []
        # No credit: every worker is priced as if it held nothing, so only the cheapest can win.
        for c in price(self._cost, cheapest_uncached(self._cost, workers, ctx.max_uncached_candidates), ctx.num_prompt_tokens):
            overlap = ctx.overlaps.get(c.worker_id)
            cached = cached_prefix_tokens(overlap.num_blocks if overlap else 0, ctx.num_prompt_tokens, ctx.block_size)
            out.append(CandidateCost(c.worker_id, c.cost, cached, ctx.num_prompt_tokens - cached, c.detail))
        return out
