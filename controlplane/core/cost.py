"""The routing cost of one candidate (Dynamo's KV-router cost, lib/kv-router).

Rule: with blocks = ceil(tokens / block_size) and credit = the sum over the leading prompt
blocks the worker holds of the weight of the fastest tier holding each,

    cost = prefill_load_scale * max(queued_prefill_blocks + prompt_blocks - credit, 0) + used_blocks

The router prices prefill workers with it, and the `kvplane` and `least-load` policies price
decode workers with it. Parameters: CostConfig below, the single source of their defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from controlplane.core.index import OverlapScore
from controlplane.core.params import check_numbers, param
from controlplane.core.pool import WorkerPool
from controlplane.core.routing import CandidateCost
from controlplane.core.views import WorkerView
from kvplane.types import Tier


@dataclass(frozen=True, slots=True)
class CostConfig:
    prefill_load_scale: float = param(1.0, "router weight of prefill work against KV blocks in use")
    # Credit per cached block by tier: the share of a block's recompute that loading it saves,
    # 1 - load time / recompute time, measured with `kvplane bench tiers` (docs/benchmarks.md:
    # host 0.99, disk 0.96 here) and rounded down for slower links than this machine's memcpy
    # (PCIe to a GPU, a cold NVMe read).
    overlap_weight_device: float = param(1.0, "cache credit per matched block held on the device")
    overlap_weight_host: float = param(0.9, "cache credit per matched block held in host memory")
    overlap_weight_disk: float = param(0.5, "cache credit per matched block held on disk")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_numbers(self)
        if not (self.overlap_weight_device >= self.overlap_weight_host >= self.overlap_weight_disk):
            raise ValueError(
                "CostConfig overlap weights must not increase with slower tiers "
                f"(overlap_weight_device {self.overlap_weight_device} >= overlap_weight_host "
                f"{self.overlap_weight_host} >= overlap_weight_disk {self.overlap_weight_disk}), "
                "because a block held at several tiers is credited at its fastest"
            )

    def tier_weight(self, tier: Tier) -> float:
        if tier is Tier.DEVICE:
            return self.overlap_weight_device
        if tier is Tier.HOST:
            return self.overlap_weight_host
        return self.overlap_weight_disk


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    """The numbers behind one candidate's cost; formatted only when someone reads it."""

    num_matched_blocks: int
    credit: float
    num_queued_blocks: int
    num_prompt_blocks: int
    num_used_blocks: int
    guard_factor: float = 1.0  # < 1: the load guard shrank the credit

    def __str__(self) -> str:
        guard = f", load guard x{self.guard_factor:.2f}" if self.guard_factor < 1.0 else ""
        return (
            f"{self.num_matched_blocks} matched blocks (credit {self.credit:g}), {self.num_queued_blocks} queued "
            f"prefill blocks, {self.num_prompt_blocks} prompt blocks, {self.num_used_blocks} used blocks{guard}"
        )


def overlap_cost(
    config: CostConfig,
    worker: WorkerView,
    num_prompt_tokens: int,
    overlap: OverlapScore | None,
    credit_scale: float = 1.0,
    queued_discount_blocks: int = 0,
) -> CandidateCost:
    """The cost of one candidate; credit_scale < 1 shrinks its cache credit (the load guard);
    queued_discount_blocks leaves out queued prefill work that computes blocks this request reuses."""
    block_size = worker.block_size
    if overlap is None:
        num_matched_blocks, credit = 0, 0.0
    else:
        num_matched_blocks = overlap.num_blocks
        credit = sum(config.tier_weight(tier) * n for tier, n in overlap.blocks_by_tier.items() if n) * credit_scale
    num_prompt_blocks = -(-num_prompt_tokens // block_size)
    num_queued_blocks = max(-(-worker.load.num_queued_prefill_tokens // block_size) - queued_discount_blocks, 0)
    num_used_blocks = worker.load.num_used_blocks
    cost = config.prefill_load_scale * max(num_queued_blocks + num_prompt_blocks - credit, 0.0) + num_used_blocks
    cached_tokens = cached_prefix_tokens(num_matched_blocks, num_prompt_tokens, block_size)
    breakdown = CostBreakdown(num_matched_blocks, credit, num_queued_blocks, num_prompt_blocks, num_used_blocks, credit_scale)
    return CandidateCost(worker.worker_id, cost, cached_tokens, num_prompt_tokens - cached_tokens, breakdown)


def cheapest_uncached(config: CostConfig, workers: Sequence[WorkerView], limit: int) -> list[WorkerView]:
    """Of workers that hold none of a prompt (cost = scale x (queued + prompt blocks) + used
    blocks, the prompt's share the same for all), the `limit` cheapest and every worker tied with
    the last of them; all of them when limit is 0. In their given order within equal cost."""
    if limit <= 0 or len(workers) <= limit:
        return list(workers)
    pool = WorkerPool.of(workers)
    costs = config.prefill_load_scale * -(-pool.column("queued") // pool.column("block_size")) + pool.column("used")
    cutoff = np.partition(costs, limit - 1)[limit - 1]
    return list(pool.where_own(costs <= cutoff))


def cached_prefix_tokens(num_matched_blocks: int, num_prompt_tokens: int, block_size: int) -> int:
    """The engine always computes at least the last prompt token, so a fully cached prompt still
    gives up its last block."""
    return min(num_matched_blocks, (num_prompt_tokens - 1) // block_size) * block_size
