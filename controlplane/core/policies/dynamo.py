"""Policy `dynamo` (peer): NVIDIA Dynamo's KV router with its defaults.

Follows ai-dynamo/dynamo lib/kv-router/src/scheduling/selector/default.rs (DefaultWorkerScorer::
worker_logit and minimum_cost_index, commit 07a6c9ce, 2026) and the defaults of
lib/kv-router/src/scheduling/config.rs (commit c2f2e1aa). Per worker, in KV blocks:

    raw_prefill = (active_prefill_tokens + prompt_tokens) / block_size
    credit      = overlap_score_credit x device + host_weight x host + disk_weight x disk
    cost        = prefill_load_scale x max(raw_prefill - credit, 0)
                  + active_decode_blocks + incoming_blocks
                  + decode_active_request_weight x active_requests

The lowest cost wins; ties are drawn at random (the Router's seeded rng; Dynamo draws among
ties by reservoir sampling). Defaults: credit 1.0, host 0.75, disk 0.25, scale 1.0, active
request weight 0, temperature 0 (argmin), credit decay 0 (off, so not modelled).

Inputs from what the planner has, and where they differ from Dynamo's:
- overlap blocks per tier: the cache index, fed by the workers' KV events (Dynamo's default
  mode; its approximate and predict-on-route modes are not modelled);
- active prefill tokens: the worker's queued prefill tokens, corrected for what this control
  plane routed since its report (Dynamo's ActiveSequences charges them on add and drops them at
  the first token, as the planner's accounting does);
- active decode blocks: the blocks in use the worker reports (Dynamo counts the distinct blocks
  of the sequences it routed); incoming blocks: all the prompt's blocks (Dynamo leaves out those
  already among the worker's active blocks; the planner does not know which those are);
- active requests: running + waiting requests (used only when the weight is set).
Parameters: DynamoParams below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvplane.controlplane.core.cost import CostConfig, cached_prefix_tokens
from kvplane.controlplane.core.params import check_numbers, param
from kvplane.controlplane.core.pool import WorkerPool
from kvplane.controlplane.core.routing import CandidateCost, RouteContext, RoutingPolicy
from kvplane.controlplane.core.views import WorkerView
from kvplane.types import Tier


@dataclass(frozen=True, slots=True)
class DynamoParams:
    name: ClassVar[str] = "dynamo"
    dynamo_overlap_score_credit: float = param(1.0, "cache credit per matched device block (Dynamo's overlap_score_credit)")
    dynamo_host_cache_hit_weight: float = param(0.75, "cache credit per matched host-memory block")
    dynamo_disk_cache_hit_weight: float = param(0.25, "cache credit per matched disk block")
    dynamo_prefill_load_scale: float = param(1.0, "weight of prefill blocks against decode blocks")
    dynamo_active_request_weight: float = param(0.0, "blocks charged per active request (decode_active_request_weight)")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_numbers(self)


class DynamoPolicy(RoutingPolicy):
    def __init__(self, params: DynamoParams, cost: CostConfig) -> None:
        del cost  # Dynamo's own weights, not kvplane's
        self._params = params

    def credit(self, blocks_by_tier) -> float:
        p = self._params
        return (
            p.dynamo_overlap_score_credit * blocks_by_tier.get(Tier.DEVICE, 0)
            + p.dynamo_host_cache_hit_weight * blocks_by_tier.get(Tier.HOST, 0)
            + p.dynamo_disk_cache_hit_weight * blocks_by_tier.get(Tier.DISK, 0)
        )

    def costs(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[CandidateCost]:
        p = self._params
        pool = WorkerPool.of(workers)
        n = ctx.num_prompt_tokens
        out = []
        for worker_id, bs, queued, used, requests in zip(
            pool.worker_ids,
            pool.column("block_size").tolist(),
            pool.column("queued").tolist(),
            pool.column("used").tolist(),
            pool.column("requests").tolist(),
        ):
            overlap = ctx.overlaps.get(worker_id)
            matched = overlap.num_blocks if overlap else 0
            credit = self.credit(overlap.blocks_by_tier) if overlap else 0.0
            raw_prefill = (queued + n) / bs
            decode = used + -(-n // bs)
            cost = p.dynamo_prefill_load_scale * max(raw_prefill - credit, 0.0) + decode + p.dynamo_active_request_weight * requests
            cached = cached_prefix_tokens(matched, n, bs)
            note = f"prefill {raw_prefill:g} blocks - credit {credit:g} ({matched} matched), decode {decode} blocks, {requests} requests"
            out.append(CandidateCost(worker_id, cost, cached, n - cached, note))
        return out
