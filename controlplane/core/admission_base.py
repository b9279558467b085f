"""What admission policies share: their config, the placements they choose among, the verdict
(Admit or Reject with a machine-readable kind), and the policy Protocol. Policies import this
module and never the registry (admission.py), so every import points one way.

Every policy sees the request, the decode candidates, and the placements the planner ranked (best
first, each with a latency prediction when the workers have models) plus the request's objective;
policies that do not predict ignore the last two.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kvplane.controlplane.core.params import check_numbers, param
from kvplane.controlplane.core.predictor import Prediction
from kvplane.controlplane.core.routing import RouteRequest
from kvplane.controlplane.core.views import WorkerView
from kvplane.types import Objective, WorkerId


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Parameters of every admission policy: the policy in force can change at run time
    (`kvplane config set admission.policy`), so all of them are configured at once."""

    max_running: int = param(64, "threshold admission: running requests per worker")
    max_waiting: int = param(32, "threshold admission: waiting requests per worker")
    max_queued_prefill_tokens: int = param(32768, "threshold admission: queued prefill tokens per worker")
    max_kv_usage: float = param(0.95, "threshold admission: KV use (used / total blocks) per worker")
    retry_after_s: float = param(
        1.0,
        "retry-after hint of a rejection; threshold admission multiplies it by 1 + how far the least-loaded candidate is over its limits",
    )
    max_retry_after_s: float = param(30.0, "largest retry-after hint a rejection carries")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name in ("max_running", "max_waiting", "max_queued_prefill_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AdmissionConfig.{name} must be an integer >= 1, got {value!r}")
        check_numbers(self)
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


class RejectKind(enum.Flag):
    """Why a request was refused, set by whoever refuses it. Several can combine (a threshold
    rejection names every limit its candidates are over); `label` is the bounded metric label."""

    NO_CANDIDATE = enum.auto()
    RUNNING = enum.auto()
    WAITING = enum.auto()
    QUEUED_PREFILL_TOKENS = enum.auto()
    KV_USE = enum.auto()
    TTFT = enum.auto()
    TPOT = enum.auto()
    BATCH_QUEUE = enum.auto()  # the batch queue was full, timed out, or shed the request

    @property
    def label(self) -> str:
        """The members' lower-case names, sorted and joined by '+'; 'other' when none is set."""
        return "+".join(sorted(member.name.lower() for member in self if member.name)) or "other"


@dataclass(frozen=True, slots=True)
class Admit:
    option: PlacementOption | None = None  # None: run the router's own choice


@dataclass(frozen=True, slots=True)
class Reject:
    reason: str  # for people: what was over which limit, or which objective was missed
    retry_after_s: float
    kind: RejectKind  # for machines: metric labels, dashboards


class AdmissionPolicy(Protocol):
    def decide(
        self,
        request: RouteRequest,
        candidates: Sequence[WorkerView],
        options: Sequence[PlacementOption] = (),
        objective: Objective | None = None,
    ) -> Admit | Reject: ...
