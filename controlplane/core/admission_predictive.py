"""Policy `predictive`: admit to the best placement predicted to meet the request's objectives.

Rule: walk the placements in the router's order (cheapest first); admit to the first whose TTFT
and TPOT stay under their objectives with 95 % confidence (Prediction.ttft_high_ms: the mean plus
the spread of a remote prefill's tail step, which carries a chunk of the decode worker's prefill
or not, WorkerPerf.tail_spread_seconds; Prediction.tpot_high_ms: the mean plus the spread of a
request's steps on a worker sharing them with arriving prefill, predictor.tpot_spread_seconds).
A placement whose workers have no latency model yet cannot be predicted and is admitted (the
models appear after a worker's first steps, or at once after `kvplane profile`). When no placement meets both, reject at
once, before any prefill work is spent, naming the objective missed by the placement that came
closest (predicted vs target) and a retry-after from the prediction:
  TTFT missed: the predicted excess (predicted - target): about how long the queue ahead must drain;
  TPOT missed: when enough of the decode worker's running requests will have finished.
Bounded to [MIN_RETRY_AFTER_S, max_retry_after_s]. The rejection's kind is the objective missed.
(Mooncake's early rejection, FAST'25.) Parameters: admission_base.AdmissionConfig (retry bounds).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvplane.controlplane.core.admission_base import AdmissionConfig, Admit, PlacementOption, Reject, RejectKind
from kvplane.controlplane.core.routing import RouteRequest
from kvplane.controlplane.core.views import WorkerView
from kvplane.types import Objective

MIN_RETRY_AFTER_S = 0.1


class PredictiveAdmission:
    __slots__ = ("_config",)

    def __init__(self, config: AdmissionConfig) -> None:
        config.validate()
        self._config = config

    def decide(
        self,
        request: RouteRequest,
        candidates: Sequence[WorkerView],
        options: Sequence[PlacementOption] = (),
        objective: Objective | None = None,
    ) -> Admit | Reject:
        if not options:
            return Reject(f"no placement for model {request.model!r}", self._config.retry_after_s, RejectKind.NO_CANDIDATE)
        if objective is None:
            return Admit(options[0])
        misses: list[tuple[float, str, PlacementOption]] = []
        for option in options:
            p = option.prediction
            if p is None:
                return Admit(option)
            ttft_over = p.ttft_high_ms / objective.ttft_ms
            tpot_over = p.tpot_high_ms / objective.tpot_ms
            if ttft_over <= 1 and tpot_over <= 1:
                return Admit(option)
            which = "ttft" if ttft_over >= tpot_over else "tpot"
            misses.append((max(ttft_over, tpot_over), which, option))
        _, which, closest = min(misses, key=lambda m: m[0])
        p = closest.prediction
        assert p is not None
        if which == "ttft":
            predicted, target = p.ttft_high_ms, objective.ttft_ms
            retry_after_s = (predicted - target) / 1000
        else:
            predicted, target = p.tpot_high_ms, objective.tpot_ms
            retry_after_s = closest.tpot_recovery_s if closest.tpot_recovery_s is not None else self._config.max_retry_after_s
        retry_after_s = min(max(retry_after_s, MIN_RETRY_AFTER_S), self._config.max_retry_after_s)
        # logfmt: machine-readable for clients, readable for people.
        reason = (
            f"objective={which} predicted_ms={predicted:.4g} target_ms={target:.4g} "
            f"decode_worker={closest.decode_worker} prefill_worker={closest.prefill_worker}"
        )
        return Reject(reason, retry_after_s, RejectKind.TTFT if which == "ttft" else RejectKind.TPOT)
