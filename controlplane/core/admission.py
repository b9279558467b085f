"""Admission: refuse a request early, with a retry-after hint, when no candidate can take it.

One small Protocol (`AdmissionPolicy.decide`) and a registry (`make_admission_policy`) so
policies are chosen by configuration, not by type checks at call sites. Policies:

- `none`: admit everything (benchmarks, single-user setups).
- `threshold`: a candidate is saturated when any of its current numbers is strictly above its
  limit: running > max_running, waiting > max_waiting, queued prefill tokens >
  max_queued_prefill_tokens, or KV use (used / total blocks) > max_kv_usage. Reject only when
  EVERY candidate is saturated; one worker with room is enough because the router sends the
  request there. Retry-after grows with how far the least-saturated candidate is over:
      excess(worker) = max over its exceeded limits of (value - limit) / limit
      retry_after    = min(retry_after_s * (1 + min over candidates of excess), max_retry_after_s)
  (limits and saturation after llm-d's saturation detector: queue depth and KV utilisation;
  the relative overshoot is a cheap stand-in for "time until it drains").

- `predictive` (admission_predictive.py): predicts TTFT and TPOT per placement and admits to the
  best placement that meets the request's objectives.

Every policy sees the request, the decode candidates, and the placements the router ranked (best
first, each with a latency prediction when the workers have models) plus the request's objective;
policies that do not predict ignore the last two.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from controlplane.core.predictor import Prediction
from controlplane.core.router import RouteRequest, WorkerView
from controlplane.core.settings import Objective
from kvplane.types import WorkerId

# How many saturated workers a rejection reason names before summarising the rest.
_MAX_WORKERS_IN_REASON = 4


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    policy: str = "threshold"
    max_running: int = 64
    max_waiting: int = 32
    max_queued_prefill_tokens: int = 32768
    max_kv_usage: float = 0.95
    retry_after_s: float = 1.0
    max_retry_after_s: float = 30.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.policy not in _POLICY_FACTORIES:
            raise ValueError(
                f"AdmissionConfig.policy {self.policy!r} is unknown; choose one of {admission_policy_names()}"
            )
        for name in ("max_running", "max_waiting", "max_queued_prefill_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AdmissionConfig.{name} must be an integer >= 1, got {value!r}")
        if not 0 < self.max_kv_usage <= 1:
            raise ValueError(f"AdmissionConfig.max_kv_usage must be in (0, 1], got {self.max_kv_usage!r}")
        if not 0 < self.retry_after_s <= self.max_retry_after_s:
            raise ValueError(
                f"AdmissionConfig.retry_after_s must be > 0 and <= max_retry_after_s "
                f"({self.max_retry_after_s!r}), got {self.retry_after_s!r}"
            )


@dataclass(frozen=True, slots=True)
class PlacementOption:
    """One way to run a request: prefill on `prefill_worker` (== decode_worker when local)."""

    decode_worker: WorkerId
    prefill_worker: WorkerId
    prediction: Prediction | None = None
    tpot_recovery_s: float | None = None  # when the decode worker's TPOT would meet the objective again

    @property
    def disaggregated(self) -> bool:
        return self.prefill_worker != self.decode_worker


@dataclass(frozen=True, slots=True)
class Admit:
    option: PlacementOption | None = None  # None: run the router's own choice


@dataclass(frozen=True, slots=True)
class Reject:
    reason: str
    retry_after_s: float


class AdmissionPolicy(Protocol):
    def decide(
        self,
        request: RouteRequest,
        candidates: Sequence[WorkerView],
        options: Sequence[PlacementOption] = (),
        objective: Objective | None = None,
    ) -> Admit | Reject: ...


class AdmitAll:
    """Policy `none`: every request is admitted."""

    __slots__ = ()

    def __init__(self, config: AdmissionConfig) -> None:
        del config  # nothing to configure; same constructor shape as every policy

    def decide(self, request, candidates, options=(), objective=None) -> Admit | Reject:
        return Admit()


@dataclass(frozen=True, slots=True)
class LimitOvershoot:
    label: str
    value: float
    limit: float

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
            )
        worker_to_overshoots: dict[WorkerId, list[LimitOvershoot]] = {}
        for worker in candidates:
            overshoots = self.overshoots(worker)
            if not overshoots:
                return Admit()
            worker_to_overshoots[worker.worker_id] = overshoots
        least_excess = min(max(o.relative for o in os) for os in worker_to_overshoots.values())
        retry_after_s = min(self._config.retry_after_s * (1 + least_excess), self._config.max_retry_after_s)
        return Reject(reason=_reason(worker_to_overshoots), retry_after_s=retry_after_s)

    def overshoots(self, worker: WorkerView) -> list[LimitOvershoot]:
        """The limits this worker is strictly above, in a fixed order (empty: it has room)."""
        cfg, load = self._config, worker.load
        # A worker that has not reported its block pool yet counts as empty, not full.
        kv_usage = load.num_used_blocks / load.num_total_blocks if load.num_total_blocks > 0 else 0.0
        checks = (
            LimitOvershoot("running", load.num_running, cfg.max_running),
            LimitOvershoot("waiting", load.num_waiting, cfg.max_waiting),
            LimitOvershoot("queued prefill tokens", load.num_queued_prefill_tokens, cfg.max_queued_prefill_tokens),
            LimitOvershoot("kv use", kv_usage, cfg.max_kv_usage),
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


def _predictive(config: AdmissionConfig) -> AdmissionPolicy:
    from controlplane.core.admission_predictive import PredictiveAdmission  # it builds on this module

    return PredictiveAdmission(config)


_POLICY_FACTORIES: dict[str, Callable[[AdmissionConfig], AdmissionPolicy]] = {
    "threshold": ThresholdAdmission,
    "none": AdmitAll,
    "predictive": _predictive,
}


def admission_policy_names() -> list[str]:
    return sorted(_POLICY_FACTORIES)


def make_admission_policy(config: AdmissionConfig) -> AdmissionPolicy:
    """Build the policy named by config.policy (validated)."""
    config.validate()
    return _POLICY_FACTORIES[config.policy](config)
