"""What the SDK returns: plain frozen dataclasses mirroring the protocol, so callers never touch protobuf.

Both clients return exactly these types; `from_proto` builds them from the wire messages.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kvplane.types import KVLayout, Role


class WorkerState(enum.Enum):
    UNSPECIFIED = "unspecified"
    ACTIVE = "active"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """What happened to one request (common.proto RequestMetrics plus its request id)."""

    prefill_worker: str = ""  # empty when prefill ran on the decode worker
    decode_worker: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_blocks: int = 0
    transport: str = ""
    ttft_ms: float = 0.0
    disaggregated: bool = False
    route_reason: str = ""
    prefill_computed_tokens: int = 0
    kv_transfer_ms: float = 0.0
    request_id: str = ""
    predicted_ttft_ms: float = 0.0  # admission's prediction when it admitted the request; 0 = none
    predicted_tpot_ms: float = 0.0
    priority: str = ""
    queued_ms: float = 0.0  # time a batch request waited in the admission queue
    kv_fetched_from: str = ""  # fetch instead of recompute: the worker whose cached prefix was pulled
    kv_fetched_tokens: int = 0
    num_migrations: int = 0  # times the request moved to another decode worker mid-stream


@dataclass(frozen=True, slots=True)
class GenerateChunk:
    """One streamed message: the tokens generated since the previous chunk."""

    token_ids: tuple[int, ...]
    text: str
    finished: bool
    finish_reason: str  # "length", "stop" or "eos" on the last chunk, else ""
    metrics: RequestMetrics | None  # set on the last chunk only
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class GenerateResult:
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    metrics: RequestMetrics

    @property
    def request_id(self) -> str:
        return self.metrics.request_id


@dataclass(frozen=True, slots=True)
class CandidateScore:
    worker_id: str
    cost: float
    cached_tokens: int
    admissible: bool
    note: str


@dataclass(frozen=True, slots=True)
class RouteResult:
    """A routing decision without running the request: which workers, and why."""

    request_id: str
    decode_worker: str
    prefill_worker: str  # empty when prefill would run on the decode worker
    disaggregated: bool
    reason: str
    prompt_tokens: int
    cached_tokens: int
    candidates: tuple[CandidateScore, ...]


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    num_running: int = 0
    num_waiting: int = 0
    num_queued_prefill_tokens: int = 0
    num_free_blocks: int = 0
    num_used_blocks: int = 0
    num_total_blocks: int = 0
    num_cached_blocks: int = 0
    num_pinned_blocks: int = 0  # held for KV transfers; 0 once traffic stops


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    worker_id: str
    role: Role | None  # None when the worker registered without a role
    endpoint: str
    model: str
    state: WorkerState
    layout: KVLayout | None
    max_context: int
    vocab_size: int
    transports: tuple[str, ...]
    max_tokens_limit: int
    load: WorkerLoad
    load_age_s: float
    metrics_url: str = ""  # the agent's Prometheus endpoint
    # Why the replica that answered routes nothing to the worker now ("" = it does): it failed or
    # stalled a request, or its load reports stopped. Each replica judges from what it saw.
    out_of_routing: str = ""


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles (kvplane.stats, interpolated) in milliseconds over a window's samples."""

    count: int = 0
    mean_ms: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """Recent requests of one worker as the control plane replica saw them."""

    worker_id: str
    num_requests: int
    ttft: LatencySummary
    itl: LatencySummary
    prompt_tokens: int
    cached_tokens: int
    kv_transfer_bytes: int

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True, slots=True)
class ClusterStats:
    workers: tuple[WorkerStats, ...]
    window_s: float
    metrics_url: str  # the replica's own Prometheus endpoint


@dataclass(frozen=True, slots=True)
class WorkerCache:
    worker_id: str
    blocks_by_tier: dict[str, int] = field(default_factory=dict)  # "device"/"host"/"disk" -> blocks
    num_pinned_blocks: int = 0  # held for KV transfers (the worker's last load report)


@dataclass(frozen=True, slots=True)
class DrainResult:
    worker_id: str
    state: WorkerState


@dataclass(frozen=True, slots=True)
class ProfileResult:
    """A worker's measured latency profile, as the control plane fitted and stored it.

    step_seconds = coefficients . (1, prefill_tokens, prefill_attention, decode_seqs,
    decode_context_tokens) (common.proto LatencyModel).
    """

    worker_id: str
    coefficients: tuple[float, ...]
    num_samples: int
    mean_abs_pct_error: float
