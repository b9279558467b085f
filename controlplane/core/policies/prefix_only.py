"""Policy `prefix-only` (baseline, SGLang's cache-aware router without its balance fallback): the
longest cached prefix wins, whatever the load; on a miss (or a tie) the worker with the fewest
cached blocks, i.e. the smallest tree. Parameters: none."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvplane.controlplane.core.cost import CostConfig, cached_prefix_tokens
from kvplane.controlplane.core.routing import CandidateCost, RouteContext, RoutingPolicy
from kvplane.controlplane.core.views import WorkerView


@dataclass(frozen=True, slots=True)
class PrefixOnlyParams:
    name: ClassVar[str] = "prefix-only"

    def validate(self) -> None:
        pass


class PrefixOnlyPolicy(RoutingPolicy):
    def __init__(self, params: PrefixOnlyParams, cost: CostConfig) -> None:
        del params, cost  # nothing to configure; same constructor shape as every policy

    def costs(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[CandidateCost]:
        sizes = ctx.index.blocks_by_tier()
        tree = {w.worker_id: sum(sizes.get(w.worker_id, {}).values()) for w in workers}
        biggest = max(tree.values(), default=0) + 1
        out = []
        for w in workers:
            overlap = ctx.overlaps.get(w.worker_id)
            num_matched = overlap.num_blocks if overlap else 0
            cached = cached_prefix_tokens(num_matched, ctx.num_prompt_tokens, w.block_size)
            # Tree size only breaks ties: it stays below one matched block.
            cost = -num_matched + tree[w.worker_id] / biggest
            note = f"{num_matched} matched blocks, {tree[w.worker_id]} cached blocks"
            out.append(CandidateCost(w.worker_id, cost, cached, ctx.num_prompt_tokens - cached, note))
        return out
