"""Admission policy `threshold`: refuse a request early, with a retry-after hint, when no
candidate has room.

Rule: a candidate is saturated when any of its current numbers is strictly above its limit:
running > max_running, waiting > max_waiting, queued prefill tokens > max_queued_prefill_tokens,
or KV use (used / total blocks) > max_kv_usage. Reject only when EVERY candidate is saturated;
one worker with room is enough because the router sends the request there. Retry-after grows
with how far the least-saturated candidate is over:
    excess(worker) = max over its exceeded limits of (value - limit) / limit
    retry_after    = min(retry_after_s * (1 + min over candidates of excess), max_retry_after_s)
(limits and saturation after llm-d's saturation detector: queue depth and KV utilisation; the
relative overshoot is a cheap stand-in for "time until it drains"). The rejection's kind names
every limit a candidate is over. Parameters: admission_base.AdmissionConfig.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplane.controlplane.core.admission_base import AdmissionConfig, Admit, Reject, RejectKind
from kvplane.controlplane.core.views import WorkerView
from kvplane.types import WorkerId

# How many saturated workers a rejection reason names before summarising the rest.
_MAX_WORKERS_IN_REASON = 4


@dataclass(frozen=True, slots=True)
class LimitOvershoot:
    label: str
    value: float
    limit: float
    kind: RejectKind

    @property
    def relative(self) -> float:
        return (self.value - self.limit) / self.limit

    def __str__(self) -> str:
        if isinstance(self.value, int):
            return f"{self.label} {self.value}>{self.limit}"
        return f"{self.label} {self.value:.3g}>{self.limit:.3g}"


class ThresholdAdmission:
    """Policy `threshold`: reject only when every candidate is over at least one limit."""

    __slots__ = ("_config",)

    def __init__(self, config: AdmissionConfig) -> None:
        config.validate()
        self._config = config

    def decide(self, request, candidates, options=(), objective=None) -> Admit | Reject:
        if not candidates:
            return Reject(
                reason=f"no candidate worker for model {request.model!r} to admit onto",
                retry_after_s=self._config.retry_after_s,
                kind=RejectKind.NO_CANDIDATE,
            )
        worker_to_overshoots: dict[WorkerId, list[LimitOvershoot]] = {}
        for worker in candidates:
            overshoots = self.overshoots(worker)
            if not overshoots:
                return Admit()
            worker_to_overshoots[worker.worker_id] = overshoots
        least_excess = min(max(o.relative for o in os) for os in worker_to_overshoots.values())
        retry_after_s = min(self._config.retry_after_s * (1 + least_excess), self._config.max_retry_after_s)
        kind = RejectKind(0)
        for overshoots in worker_to_overshoots.values():
            for o in overshoots:
                kind |= o.kind
        return Reject(reason=_reason(worker_to_overshoots), retry_after_s=retry_after_s, kind=kind)

    def overshoots(self, worker: WorkerView) -> list[LimitOvershoot]:
        """The limits this worker is strictly above, in a fixed order (empty: it has room)."""
        cfg, load = self._config, worker.load
        # A worker that has not reported its block pool yet counts as empty, not full.
        kv_usage = load.num_used_blocks / load.num_total_blocks if load.num_total_blocks > 0 else 0.0
        checks = (
            LimitOvershoot("running", load.num_running, cfg.max_running, RejectKind.RUNNING),
            LimitOvershoot("waiting", load.num_waiting, cfg.max_waiting, RejectKind.WAITING),
            LimitOvershoot(
                "queued prefill tokens",
                load.num_queued_prefill_tokens,
                cfg.max_queued_prefill_tokens,
                RejectKind.QUEUED_PREFILL_TOKENS,
            ),
            LimitOvershoot("kv use", kv_usage, cfg.max_kv_usage, RejectKind.KV_USE),
        )
        return [o for o in checks if o.value > o.limit]


def _reason(worker_to_overshoots: dict[WorkerId, list[LimitOvershoot]]) -> str:
    parts = [
        f"{worker_id} ({', '.join(str(o) for o in overshoots)})"
        for worker_id, overshoots in sorted(worker_to_overshoots.items())[:_MAX_WORKERS_IN_REASON]
    ]
    num_more = len(worker_to_overshoots) - len(parts)
    if num_more > 0:
        parts.append(f"+{num_more} more")
    return f"all {len(worker_to_overshoots)} candidates over limits: " + "; ".join(parts)
