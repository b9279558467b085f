"""The routing cost of one candidate (Dynamo's KV-router cost, lib/kv-router).

Rule: with blocks = ceil(tokens / block_size) and credit = the sum over the leading prompt
blocks the worker holds of the weight of the fastest tier holding each,

    cost = prefill_load_scale * max(queued_prefill_blocks + prompt_blocks - credit, 0) + used_blocks

The router prices the prefill workers of the policies that price by a cost with it, and the
`least-load` policy prices decode workers with it (without credit). The default policy,
`kvplane`, prices in predicted seconds instead (core/seconds.py). Parameters: CostConfig below,
the single source of their defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvplane.controlplane.core.index import OverlapScore
from kvplane.controlplane.core.params import check_numbers, param
from kvplane.controlplane.core.pool import WorkerPool, WorkerTable
from kvplane.controlplane.core.routing import CandidateCost
from kvplane.controlplane.core.views import WorkerView
from kvplane.types import Tier, WorkerId


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

    def __str__(self) -> str:
        return (
            f"{self.num_matched_blocks} matched blocks (credit {self.credit:g}), {self.num_queued_blocks} queued "
            f"prefill blocks, {self.num_prompt_blocks} prompt blocks, {self.num_used_blocks} used blocks"
        )


class Priced(Sequence[CandidateCost]):
    """Candidates priced together: one array per field (rows: their WorkerTable rows), and a
    CandidateCost made only for the ones someone reads, so a thousand priced candidates cost
    a few array operations, not a thousand objects."""

    __slots__ = ("worker_ids", "rows", "cost", "cached_tokens", "prefill_tokens", "_detail")

    def __init__(self, worker_ids, rows, cost, cached_tokens, prefill_tokens, detail: Callable[[int], object]) -> None:
        self.worker_ids: list[WorkerId] = worker_ids
        self.rows: np.ndarray = rows
        self.cost: np.ndarray = cost
        self.cached_tokens: np.ndarray = cached_tokens
        self.prefill_tokens: np.ndarray = prefill_tokens
        self._detail = detail

    @staticmethod
    def of(costs: Sequence[CandidateCost], table: WorkerTable) -> Priced:
        """A policy's candidates (Priced already, or CandidateCost objects) as columns."""
        if isinstance(costs, Priced):
            return costs
        costs = list(costs)
        return Priced(
            [c.worker_id for c in costs],
            np.array([table.row_of[c.worker_id] for c in costs], np.int64),
            np.array([c.cost for c in costs], np.float64),
            np.array([c.cached_tokens for c in costs], np.int64),
            np.array([c.prefill_tokens for c in costs], np.int64),
            lambda i: costs[i].detail,
        )

    def take(self, order: np.ndarray) -> Priced:
        """These candidates in `order` (indices into this one)."""
        ids = self.worker_ids
        return Priced(
            [ids[i] for i in order.tolist()],
            self.rows[order],
            self.cost[order],
            self.cached_tokens[order],
            self.prefill_tokens[order],
            lambda i: self._detail(int(order[i])),
        )

    def ranked(self, table: WorkerTable) -> Priced:
        """Cheapest first, equal costs in worker-id order (what a seeded draw among ties needs)."""
        return self.take(np.lexsort((table.id_rank[self.rows], self.cost)))

    def __len__(self) -> int:
        return len(self.worker_ids)

    def __getitem__(self, i):  # an int or a slice, as a list's
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]
        return CandidateCost(
            self.worker_ids[i], float(self.cost[i]), int(self.cached_tokens[i]), int(self.prefill_tokens[i]), self._detail(i)
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def price(
    config: CostConfig, workers: WorkerPool, num_prompt_tokens: int, overlaps: Mapping[WorkerId, OverlapScore] | None = None
) -> Priced:
    """The cost of each worker of the pool (module docstring), in pool order. `overlaps`: the
    prompt's cached prefix per worker (None: no worker holds any of it)."""
    n, table, rows = len(workers), workers.table, workers.rows
    matched = credit = None  # per row; None: 0 for every row
    if overlaps is not None and n:
        matched, credit = _score_columns(config, workers, overlaps)
    cost, cached_tokens = _cost_columns(config, table, rows, num_prompt_tokens, matched, credit)

    def detail(i: int) -> CostBreakdown:
        row = int(rows[i])
        block_size = int(table.block_size[row])
        return CostBreakdown(
            int(matched[i]) if matched is not None else 0,
            float(credit[i]) if credit is not None else 0.0,
            -(-int(table.queued[row]) // block_size),
            -(-num_prompt_tokens // block_size),
            int(table.used[row]),
        )

    return Priced(workers.worker_ids, rows, cost, cached_tokens, num_prompt_tokens - cached_tokens, detail)


def _cost_columns(
    config: CostConfig,
    table: WorkerTable,
    rows: np.ndarray,
    num_prompt_tokens: int,
    matched: np.ndarray | None,
    credit: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """(cost, cached tokens) of each of `rows`."""
    block_size, queued, used = table.block_size[rows], table.queued[rows], table.used[rows]
    num_prompt_blocks = -(-num_prompt_tokens // block_size)
    uncovered = -(-queued // block_size) + num_prompt_blocks - (credit if credit is not None else 0.0)
    cost = config.prefill_load_scale * np.maximum(uncovered, 0.0) + used
    cached_tokens = np.minimum(matched if matched is not None else 0, (num_prompt_tokens - 1) // block_size) * block_size
    return cost, cached_tokens


def _score_columns(config: CostConfig, workers: WorkerPool, overlaps: Mapping[WorkerId, OverlapScore]) -> tuple[np.ndarray, np.ndarray]:
    """Per worker of the pool: matched blocks and credit; 0 for a worker without a score.
    Computed per distinct score (a hot prefix's holders share one)."""
    codes, per = workers.distinct_values(overlaps)
    matched = np.array([s.num_blocks if s else 0 for s in per], np.int64)[codes]
    credit = np.array([_raw_credit(config, s) for s in per], np.float64)[codes]
    return matched, credit


def _raw_credit(config: CostConfig, overlap: OverlapScore | None) -> float:
    """The credit: the tier weight of each matched block, summed."""
    if overlap is None:
        return 0.0
    return sum(config.tier_weight(tier) * n for tier, n in overlap.blocks_by_tier.items())


def cheapest_uncached(config: CostConfig, workers: Sequence[WorkerView], limit: int) -> WorkerPool:
    """Of workers that hold none of a prompt (cost = scale x (queued + prompt blocks) + used
    blocks, the prompt's share the same for all), the `limit` cheapest and every worker tied with
    the last of them; all of them when limit is 0. In their given order."""
    pool = WorkerPool.of(workers)
    if limit <= 0 or len(pool) <= limit:
        return pool
    costs = config.prefill_load_scale * -(-pool.column("queued") // pool.column("block_size")) + pool.column("used")
    cutoff = np.partition(costs, limit - 1)[limit - 1]
    return pool.where_own(costs <= cutoff)


def cached_prefix_tokens(num_matched_blocks: int, num_prompt_tokens: int, block_size: int) -> int:
    """The engine always computes at least the last prompt token, so a fully cached prompt still
    gives up its last block."""
    return min(num_matched_blocks, (num_prompt_tokens - 1) // block_size) * block_size
