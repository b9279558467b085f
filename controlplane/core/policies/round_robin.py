"""Policy `round-robin` (baseline): decode candidates take turns in worker-id order, whatever
they cache or carry. Parameters: none."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvplane.controlplane.core.cost import CostConfig, cached_prefix_tokens
from kvplane.controlplane.core.routing import CandidateCost, RouteContext, RouteDecision, RoutingPolicy
from kvplane.controlplane.core.views import WorkerView


@dataclass(frozen=True, slots=True)
class RoundRobinParams:
    name: ClassVar[str] = "round-robin"

    def validate(self) -> None:
        pass


class RoundRobinPolicy(RoutingPolicy):
    def __init__(self, params: RoundRobinParams, cost: CostConfig) -> None:
        del params, cost  # nothing to configure; same constructor shape as every policy
        self._num_routed = 0

    def costs(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[CandidateCost]:
        ordered = sorted(w.worker_id for w in workers)
        out = []
        for w in workers:
            turn = (ordered.index(w.worker_id) - self._num_routed) % len(ordered)
            overlap = ctx.overlaps.get(w.worker_id)
            cached = cached_prefix_tokens(overlap.num_blocks if overlap else 0, ctx.num_prompt_tokens, w.block_size)
            out.append(CandidateCost(w.worker_id, float(turn), cached, ctx.num_prompt_tokens - cached, f"turn {turn}"))
        return out

    def on_routed(self, decision: RouteDecision, now: float) -> None:
        self._num_routed += 1
