"""The cluster as the planner sees it: plain, frozen data that anyone can build.

The control plane builds these from the store (controlplane/cluster_state.py); a simulator or a
test builds them by hand. `WorkerLoadView` holds what the worker last reported; the planner
adjusts it for the requests this replica has routed since (controlplane/core/accounting.py)
before any policy sees it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field

from kvplane.controlplane.core.index import CacheIndex
from kvplane.latency import StepTimeModel
from kvplane.types import Role, WorkerId, is_native_transport

# Prefill tokens per engine step assumed for a worker that does not state its own.
DEFAULT_CHUNK_TOKENS = 2048


@dataclass(frozen=True, slots=True)
class WorkerLoadView:
    num_running: int
    num_waiting: int
    num_queued_prefill_tokens: int
    num_free_blocks: int
    num_used_blocks: int
    num_total_blocks: int
    # Tokens each running request may still generate, and their total context (the predictor's
    # decode-batch forecast).
    running_remaining_tokens: tuple[int, ...] = ()
    running_context_tokens: int = 0


@dataclass(frozen=True, slots=True)
class WorkerView:
    worker_id: WorkerId
    role: Role
    model: str
    block_size: int
    active: bool  # False while draining: finishes its work, takes no new requests
    load: WorkerLoadView
    max_context: int
    block_nbytes: int = 0  # KV bytes per block (0 = unknown: never a fetch source or target)
    # New KV blocks of requests routed here that no load report shows yet (set by the planner's
    # accounting). Not in used blocks: a burst's first request would then outweigh, in a cost,
    # the very prefix it is computing for the others. No routing policy reads them at present.
    pending_blocks: int = 0
    latency: StepTimeModel | None = None  # the worker's step-time model (None: no prediction)
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS  # prefill tokens per engine step
    max_num_seqs: int = 0  # 0 = no slot limit known
    reported_at: float | None = None  # when its latest load report arrived (monotonic s; None = unknown)
    # KV transports the worker serves (None = not stated: any). A remote prefill needs one the
    # decode worker shares; a fetch needs a shared kvplane transport (not an engine's own connector).
    transports: tuple[str, ...] | None = None

    def can_move_kv_with(self, other: WorkerView, *, cached_blocks: bool = False) -> bool:
        """Whether KV can move between the two workers (kv_can_move)."""
        return kv_can_move(self.transports, other.transports, cached_blocks=cached_blocks)


def kv_can_move(a: tuple[str, ...] | None, b: tuple[str, ...] | None, *, cached_blocks: bool = False) -> bool:
    """Whether KV can move between workers serving transports `a` and `b` (None: not stated,
    any): they share one; for a fetch of cached blocks, a kvplane transport (engine-native
    connectors carry only a remote prefill)."""
    if a is None or b is None:
        return True
    common = set(a) & set(b)
    if cached_blocks:
        common = {t for t in common if not is_native_transport(t)}
    return bool(common)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Every registered worker and where the KV blocks live."""

    workers: tuple[WorkerView, ...]
    index: CacheIndex
    # Until when reports demonstrably got through (monotonic s; None = unknown): the store and the
    # bus they travel on answered, and some worker's report arrived. A report missing while others
    # arrive means the worker is silent, not that the store or bus is down (core/health.py).
    store_ok_at: float | None = None
    # The workers as columns (a pool.WorkerTable of exactly `workers`), when the builder keeps
    # one up to date (controlplane/cluster_state.py); otherwise pool.table_of builds it once.
    table: object | None = field(default=None, compare=False, repr=False)
    # The KV link rate the workers state (WorkerInfo.link_gb_per_s), bytes/s: the median of those
    # that state one, 0 when none does. What transfers are predicted with until some are measured.
    stated_link_bytes_per_s: float = 0.0

    def without(self, worker_ids: Collection[str]) -> ClusterView:
        if not worker_ids:
            return self
        return dataclasses.replace(self, workers=tuple(w for w in self.workers if w.worker_id not in worker_ids), table=None)
