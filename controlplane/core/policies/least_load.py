"""Policy `least-load` (baseline): Dynamo's cost with no cache credit, i.e. the candidate with the
least queued prefill work plus prompt plus KV blocks in use wins, whatever it caches.
Parameters: prefill_load_scale."""
from __future__ import annotations

from collections.abc import Sequence

from controlplane.core.policies import PolicyHooks
from controlplane.core.router import (
    CandidateCost,
    RouteContext,
    RouterConfig,
    WorkerView,
    cached_prefix_tokens,
    overlap_cost,
)


class LeastLoadPolicy(PolicyHooks):
    def __init__(self, config: RouterConfig) -> None:
        self._config = config

    def costs(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[CandidateCost]:
        out = []
        for w in workers:
            c = overlap_cost(self._config, w, ctx.num_prompt_tokens, None)
            overlap = ctx.overlaps.get(w.worker_id)
            cached = cached_prefix_tokens(overlap.num_blocks if overlap else 0, ctx.num_prompt_tokens, w.block_size)
            out.append(CandidateCost(w.worker_id, c.cost, cached, ctx.num_prompt_tokens - cached, c.note))
        return out
