"""The request planner: where a request runs, or why it is refused, from plain data.

    Planner.plan(request, cluster, settings, now) -> Plan | Reject

1. Route (`Planner.route`): the workers' reported loads are corrected for what this replica has
   routed (accounting.LoadLedger) and discounted where the TTFT measured there contradicts them
   (trust.ReportTrust); the router picks the decode worker, where prefill runs and
   whether to fetch a cached prefix (router.py). Placement options follow: the router's first,
   then every other decode candidate by cost (prefilling where the router's placement does), each
   with a latency prediction (predictor.py) corrected by what past requests measured.
2. Admit (`Planner.admit`): the admission policy in force (the run-time setting, else the
   configured one) admits one option or rejects with a reason, a retry-after and a kind.
A Plan names the workers, the prediction, the fetch (only when admission kept the router's own
placement: a fetch belongs to that placement) and the load it puts on each worker (`charges`).
No candidate at all (unknown model, every worker draining, ...) raises routing.NoCandidateError.

The planner owns the state that planning learns from; whoever runs the requests (the gRPC
servicer, a simulator) feeds it:
- dispatched(plan, now) -> dispatch id: the request was sent as planned; its load is charged and
  the routing policy records it (predicted prefixes, round-robin turns);
- remote_prefill_ended(id, now): its prefill worker is done (the decode agent says so before it
  pulls the KV): that worker's share is released;
- prefill_ended(id, now) and finished(id, now, outcome): its load is released at once; a
  finished request's measured latencies calibrate later predictions, its transfer the link rate;
- load_reported(worker, now, sampled_at), kv_stored(worker, hashes), worker_removed(worker);
- worker_stalled(worker, now) / worker_failed(worker, now): a request there made no progress in
  time / failed because of the worker.
Workers out of routing (health.py: stalled, or silent while the store works) are left out before
routing; when that leaves no candidate the NoCandidateError is `transient`. `place` routes without
admission, for migrating a request that was admitted already (failover.py).
Nothing here reads a clock, a store or the network: `now` is passed in (seconds on one monotonic
clock) and the random draw comes from `rng`, so a run is reproducible.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kvplane.controlplane.core.accounting import Charge, LoadLedger
from kvplane.controlplane.core.admission import admission_policy_names, check_admission_policy, make_admission_policy
from kvplane.controlplane.core.admission_base import AdmissionConfig, AdmissionPolicy, Admit, PlacementOption, Reject
from kvplane.controlplane.core.health import HealthConfig, WorkerHealth
from kvplane.controlplane.core.index import OverlapScore
from kvplane.controlplane.core.inflow import PrefillInflow
from kvplane.controlplane.core.params import check_numbers, param
from kvplane.controlplane.core.pool import WorkerPool, table_of
from kvplane.controlplane.core.predictor import Calibration, LinkRate, Prediction, WorkerPerf, blocks_to_transfer, predict, tpot_recovery_s
from kvplane.controlplane.core.router import Router, RouterConfig
from kvplane.controlplane.core.routing import CandidateCost, NoCandidateError, RouteDecision, RouteRequest
from kvplane.controlplane.core.settings import ClusterSettings
from kvplane.controlplane.core.trust import ReportTrust, TrustConfig
from kvplane.controlplane.core.views import ClusterView, WorkerView
from kvplane.types import BlockHash, Objective, WorkerId

TPOT = "tpot"  # the calibration kind of time per output token
# A decoding request's TPOT so far is reported (Planner.decoding) once it has this many tokens.
EARLY_TPOT_TOKENS = 16


def ttft_kind(disaggregated: bool) -> str:
    """The calibration kind of a placement's time to first token."""
    return "ttft-disaggregated" if disaggregated else "ttft-local"


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    router: RouterConfig = field(default_factory=RouterConfig)
    admission_policy: str = param(
        "threshold",
        "admission policy at start-up (the run-time setting admission.policy wins)",
        flag="--admission",
        choices=admission_policy_names,
    )
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    initial_link_gb_per_s: float = param(
        0.0,
        "KV transfer rate predictions assume until transfers are measured, GB/s (0 = the median rate the workers state, "
        "agent --link-gb-per-s; 1 GB/s when none states one)",
    )
    link_rate_weight: float = param(0.2, "weight of the newest measured transfer rate in the link-rate mean")
    calibration_weight: float = param(0.2, "weight of the newest measured - predicted latency in the calibration mean")
    calibration_half_life_s: float = param(5.0, "seconds for a latency calibration to fade by half while nothing is measured")
    prefill_inflow_window_s: float = param(
        2.0, "seconds over which the prefill work routed to a worker is averaged into the rate that slows its decodes (TPOT)"
    )
    report_lag_s: float = param(
        0.1, "a load report with no sample time arriving this soon after a request's prefill ended or it finished may predate that"
    )
    stale_report_s: float = param(1.0, "a load report older than this stops standing: its counts decay (see --stale-half-life-s)")
    stale_half_life_s: float = param(
        1.0, "seconds for a stale load report's counts to halve (reports stopped: a dead agent, a store outage)"
    )
    health: HealthConfig = field(default_factory=HealthConfig)
    trust: TrustConfig = field(default_factory=TrustConfig)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        self.router.validate()
        self.admission.validate()
        check_admission_policy(self.admission_policy)
        self.health.validate()
        self.trust.validate()
        check_numbers(self, positive=("calibration_half_life_s", "stale_half_life_s", "prefill_inflow_window_s"))
        for name in ("link_rate_weight", "calibration_weight"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"PlannerConfig.{name} must be in (0, 1], got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class Routed:
    """A routed request before admission: the router's decision and every placement option."""

    request: RouteRequest
    decision: RouteDecision
    candidates: Sequence[WorkerView]  # the decode candidates, loads corrected (a WorkerPool)
    options: Sequence[PlacementOption]  # the router's placement first, then by cost (LazyOptions)
    objective: Objective
    block_size: int
    now: float  # when it was routed (what trust.excess_s is asked at, for a probe)


def reusable_tokens(held: Mapping[WorkerId, OverlapScore], worker_id: WorkerId, prompt_tokens: int, block_size: int) -> int:
    """The prompt tokens `worker_id` does not compute again: its held blocks, all but the prompt's
    last token at most (that one is computed for its logits)."""
    score = held.get(worker_id)
    return min(score.num_blocks, (prompt_tokens - 1) // block_size) * block_size if score is not None else 0


@dataclass(frozen=True, slots=True)
class Plan:
    request: RouteRequest
    decision: RouteDecision  # the router's own choice (admission may have moved the request)
    decode_worker: WorkerId
    prefill_worker: WorkerId | None  # None: prefill on the decode worker
    prediction: Prediction | None
    options: Sequence[PlacementOption]  # every placement considered, the router's first
    block_size: int
    fetch_from: WorkerId | None = None  # pull the cached prefix from this worker before prefilling
    fetch_tokens: int = 0
    # Admitted only to measure again (Planner._probe): "trust", a discounted worker; "calibration",
    # the model where only the calibration's offset refused it. "": admitted as usual.
    probe: str = ""

    @property
    def disaggregated(self) -> bool:
        return self.prefill_worker is not None

    @property
    def follows_router(self) -> bool:
        d = self.decision
        return self.decode_worker == d.decode_worker and self.prefill_worker == d.prefill_worker

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the decode worker holds (as the router found them; 0 elsewhere)."""
        return self.decision.cached_tokens if self.follows_router else 0

    def without_fetch(self) -> Plan:
        return dataclasses.replace(self, fetch_from=None, fetch_tokens=0)

    @property
    def charges(self) -> tuple[Charge, ...]:
        """The load this plan puts on each worker: the decode worker holds the prompt and output
        blocks and computes what no cached or fetched prefix provides (all of it comes over the
        wire when disaggregated); a prefill worker computes the prompt after the prefix it holds
        (as the prediction counts it: counted whole, a shared system prompt made every prefill
        worker's queue look longer by that prompt per request sent there)."""
        prompt, bs = self.decision.prompt_tokens, max(self.block_size, 1)
        reused = self.cached_tokens + self.fetch_tokens
        num_blocks = math.ceil((prompt + self.request.max_tokens) / bs)
        decode = Charge(
            worker_id=self.decode_worker,
            prefill_tokens=0 if self.disaggregated else prompt - reused,
            num_blocks=num_blocks,
            num_new_blocks=num_blocks - reused // bs,
            decodes=True,
            imported=self.disaggregated,
        )
        if self.prefill_worker is None:
            return (decode,)
        own = reusable_tokens(self.decision.priced_overlaps, self.prefill_worker, prompt, bs)
        return decode, Charge(self.prefill_worker, prompt - own, 0, 0, decodes=False)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a finished request measured (None: not measured)."""

    ttft_s: float | None = None  # dispatch to first token
    tpot_s: float | None = None  # mean time per output token after the first
    kv_transfer_bytes: int = 0
    kv_transfer_s: float = 0.0


class LazyOptions(Sequence[PlacementOption]):
    """Placement options made and predicted when first read, once: the router's own first, then
    one per other decode candidate in its order, prefilling where the router's placement does.
    Threshold admission reads none but the chosen one and predictive admission stops at the
    first that meets the objectives, so a thousand candidates cost a thousand predictions (or
    options) only when every one of them is needed."""

    __slots__ = ("_first", "_others", "_predict", "_predicted")

    def __init__(
        self, first: PlacementOption, candidates: Sequence[WorkerId], predict: Callable[[PlacementOption], PlacementOption]
    ) -> None:
        self._first = first
        self._others = [w for w in candidates if w != first.decode_worker]
        self._predict = predict
        self._predicted: dict[int, PlacementOption] = {}

    def __len__(self) -> int:
        return 1 + len(self._others)

    def __getitem__(self, i):  # an int or a slice, as a tuple's
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        j = range(len(self))[i]  # negative indices; IndexError past the end
        option = self._predicted.get(j)
        if option is None:
            option = self._predicted[j] = self._predict(self._placement(j))
        return option

    def _placement(self, j: int) -> PlacementOption:
        first = self._first
        if j == 0:
            return first
        w = self._others[j - 1]
        return PlacementOption(w, first.prefill_worker if first.disaggregated and first.prefill_worker != w else w)


def _ids(candidates: Sequence[CandidateCost]) -> list[WorkerId]:
    """The candidates' worker ids, without making each candidate (cost.Priced keeps them as a list)."""
    ids = getattr(candidates, "worker_ids", None)
    return ids if ids is not None else [c.worker_id for c in candidates]


class Planner:
    def __init__(self, config: PlannerConfig, rng: random.Random | None = None) -> None:
        config.validate()
        self.config = config
        self.router = Router(config.router, rng)
        self.ledger = LoadLedger(config.report_lag_s, config.stale_report_s, config.stale_half_life_s)
        self.health = WorkerHealth(config.health)
        # A disaggregated TTFT is calibrated as the local one plus its own extra (Calibration).
        bases = {ttft_kind(True): ttft_kind(False)}
        self.calibration = Calibration(config.calibration_weight, config.calibration_half_life_s, bases)
        self.link = LinkRate(config.initial_link_gb_per_s * 1e9, config.link_rate_weight)
        self.inflow = PrefillInflow(config.prefill_inflow_window_s)
        self._stated_link_bytes_per_s = 0.0  # the workers' stated rate, as the last routed view said
        self.trust = ReportTrust(config.trust)
        self._discount_at_dispatch: dict[int, tuple[float, float]] = {}  # dispatch -> trust's discounts then (decode, prefill)
        self._admission: dict[str, AdmissionPolicy] = {}
        self._dispatched: dict[int, Plan] = {}
        self._probing: dict[WorkerId, int] = {}  # a discounted worker -> the dispatch measuring it again
        self._next_dispatch_id = 1

    # -- planning --------------------------------------------------------------------------------

    def plan(self, request: RouteRequest, cluster: ClusterView, settings: ClusterSettings, now: float) -> Plan | Reject:
        return self.admit(self.route(request, cluster, settings, now), settings)

    def link_bytes_per_s(self) -> float:
        """The KV link rate predictions use now (LinkRate: measured, else given, else stated by the workers)."""
        return self.link.rate(self._stated_link_bytes_per_s)

    def route(self, request: RouteRequest, cluster: ClusterView, settings: ClusterSettings, now: float) -> Routed:
        out = self.health.excluded(cluster, now)
        self._stated_link_bytes_per_s = cluster.stated_link_bytes_per_s
        table = table_of(cluster)
        # Reports corrected for what this replica routed, then discounted where latency contradicts them (trust.py).
        pool = self.trust.discounted(self.ledger.corrected(table, now), now).pool(out)
        objective = settings.objective(request.model, request.priority)
        cal = self.calibration
        offsets = (cal.offset(ttft_kind(False), now), cal.offset(ttft_kind(True), now), cal.offset(TPOT, now))
        try:
            decision = self.router.route(
                request, pool, cluster.index, now, objective=objective, link_bytes_per_s=self.link_bytes_per_s(), offsets=offsets,
                prefill_inflow=self.inflow.view(pool.table, now),
            )  # fmt: skip
        except NoCandidateError as e:
            if not out or e.transient:
                raise
            # Workers exist but are out for now: a retry later may find them back.
            why = "; ".join(f"{w}: {reason}" for w, reason in sorted(out.items()))
            raise type(e)(f"{e} (out of routing for now: {why})", transient=True) from None
        t = pool.table
        candidates = pool.where(t.serving(request.model, "decode"))
        # The router already walked the index for the prompt; that walk serves every option. The
        # prefixes the policy predicted count: the request queues behind the work computing them.
        held = decision.priced_overlaps
        first = PlacementOption(decision.decode_worker, decision.prefill_worker or decision.decode_worker)
        fetch = (decision.fetch_tokens, decision.fetch_s) if decision.fetch_from is not None else (0, 0.0)

        def predicted(o: PlacementOption) -> PlacementOption:
            return self._predicted(request, o, pool, held, objective, now, fetch if o == first else (0, 0.0))

        options = LazyOptions(first, _ids(decision.candidates), predicted)
        decode_view = pool.get(decision.decode_worker)
        assert decode_view is not None
        return Routed(request, decision, candidates, options, objective, decode_view.block_size, now)

    def place(self, request: RouteRequest, cluster: ClusterView, settings: ClusterSettings, now: float) -> Plan:
        """The router's placement without admission: for a request admitted already whose
        worker failed mid-stream (a migration must not be rejected halfway through its answer)."""
        routed = self.route(request, cluster, settings, now)
        first = routed.options[0]
        return Plan(
            request=request,
            decision=routed.decision,
            decode_worker=first.decode_worker,
            prefill_worker=first.prefill_worker if first.disaggregated else None,
            prediction=first.prediction,
            options=routed.options,
            block_size=routed.block_size,
        )

    def admit(self, routed: Routed, settings: ClusterSettings) -> Plan | Reject:
        verdict = self.admission_policy(settings).decide(routed.request, routed.candidates, routed.options, routed.objective)
        probe, kind = None, ""
        if isinstance(verdict, Reject):
            if self.admission_policy_name(settings) == "predictive":
                probe, kind = self._probe(routed)
            if probe is None:
                return verdict
        chosen = probe or verdict.option or routed.options[0]
        d = routed.decision
        plan = Plan(
            request=routed.request,
            decision=d,
            decode_worker=chosen.decode_worker,
            prefill_worker=chosen.prefill_worker if chosen.disaggregated else None,
            prediction=chosen.prediction,
            options=routed.options,
            block_size=routed.block_size,
            probe=kind,
        )
        if d.fetch_from is not None and plan.follows_router:
            plan = dataclasses.replace(plan, fetch_from=d.fetch_from, fetch_tokens=d.fetch_tokens)
        return plan

    def _probe(self, routed: Routed) -> tuple[PlacementOption | None, str]:
        """A placement to admit although predictive admission rejected the request, and why:
        "trust": prefilling on a worker whose load reports are discounted (trust.py), which only
        the discount keeps from meeting the objectives, while no other request measures it. A
        discount lasts until requests there show it gone, and a rejected request shows nothing:
        without a probe, one worker serving alone was refused everything for the whole hold (30 s)
        after two slow requests (a pause, a warm-up). A worker that does run late gets one request
        at a time. "calibration": the router's placement, which the model alone predicts to meet
        the objectives and only the calibration's offsets (Calibration) refuse, while no request
        this planner admitted is under way (the probe included). The offsets are the fleet's and fade with a half-life while
        nothing is measured: after a burst of slow requests they refuse everything, on an idle
        fleet, until they have faded (test_core_trust.py; a likely cause, not confirmed, of a
        `kvplane bench load` run that admitted 0 of 458 at 1x after its capacity run, one run
        in seven). One request at a time measures the model again."""
        objective = routed.objective
        if objective is None:
            return None, ""
        if self.trust.may_discount:  # a rejection in an overload: no walk of every option again
            option = self._trust_probe(routed, objective)
            if option is not None:
                return option, "trust"
        # Only while nothing admitted is under way: a request in flight will measure the model
        # anyway, and a probe then is a placement the calibration refused, whose outcome biases
        # it towards refusing more (on 8 P + 8 D with the trace at 16x and 32x, probing in the
        # overload cost 10-12 % of goodput).
        if not self._dispatched:
            option = routed.options[0]
            p = option.prediction
            # On a discounted worker the discount is trust's to measure (above), not the model's.
            trusted = not any(
                self.trust.excess_s(w, routed.now) > 0 or w in self._probing for w in {option.decode_worker, option.prefill_worker}
            )
            if p is not None and trusted and (p.ttft_offset_s > 0 or p.tpot_offset_s > 0):
                # As admission holds them (their 95 % points), less the offsets.
                raw_ttft_ms, raw_tpot_ms = p.ttft_high_ms - p.ttft_offset_s * 1000, p.tpot_high_ms - p.tpot_offset_s * 1000
                if raw_ttft_ms <= objective.ttft_ms and raw_tpot_ms <= objective.tpot_ms:
                    return option, "calibration"
        return None, ""

    def _trust_probe(self, routed: Routed, objective: Objective) -> PlacementOption | None:
        for option in routed.options:
            worker = option.decode_worker
            p = option.prediction
            if p is None or option.disaggregated or worker in self._probing:
                continue
            excess_s = self.trust.excess_s(worker, routed.now)
            # TPOT as admission holds it (its 95 % point): the discount is all that may stand in the way.
            if excess_s > 0 and p.ttft_ms - excess_s * 1000 <= objective.ttft_ms and p.tpot_high_ms <= objective.tpot_ms:
                return option
        return None

    def admissible(self, routed: Routed, settings: ClusterSettings) -> dict[WorkerId, bool]:
        """Per decode candidate, whether the admission policy alone would take it (what
        `kvplane route` shows)."""
        policy = self.admission_policy(settings)
        by_decode = {o.decode_worker: o for o in routed.options[1:]}
        ranked = set(_ids(routed.decision.candidates))
        return {
            w.worker_id: isinstance(
                policy.decide(routed.request, [w], [by_decode.get(w.worker_id, routed.options[0])], routed.objective), Admit
            )
            for w in routed.candidates
            if w.worker_id in ranked
        }

    def admission_policy_name(self, settings: ClusterSettings) -> str:
        """The admission policy in force: a run-time setting wins over the start-up one."""
        return settings.admission_policy(self.config.admission_policy)

    def admission_policy(self, settings: ClusterSettings) -> AdmissionPolicy:
        name = self.admission_policy_name(settings)
        policy = self._admission.get(name)
        if policy is None:
            policy = self._admission[name] = make_admission_policy(name, self.config.admission)
        return policy

    def _predicted(
        self,
        request: RouteRequest,
        option: PlacementOption,
        pool: WorkerPool,
        held: Mapping[WorkerId, OverlapScore],
        objective: Objective,
        now: float,
        fetch: tuple[int, float] = (0, 0.0),
    ) -> PlacementOption:
        """`option` with its latency prediction; `held`: the prompt's cached prefix per worker;
        `fetch`: (tokens, seconds) of the router's fetch when the option is the router's own."""
        decode_view, prefill_view = pool.get(option.decode_worker), pool.get(option.prefill_worker)
        assert decode_view is not None and prefill_view is not None  # options come from the pool
        inflow, per_work_s = self.inflow, self.inflow.per_work_s(now)
        decode = WorkerPerf.of(
            decode_view,
            inflow.rate(option.decode_worker, now),
            per_work_s,
            inflow.mean_work(option.decode_worker),
            inflow.spread_work(option.decode_worker),
        )
        prefill = WorkerPerf.of(prefill_view, inflow.rate(option.prefill_worker, now), per_work_s, inflow.mean_work(option.prefill_worker))
        prompt = len(request.prompt_token_ids)

        def num_held(worker_id: WorkerId) -> int:
            score = held.get(worker_id)
            return score.num_blocks if score is not None else 0

        prefill_cached = reusable_tokens(held, option.prefill_worker, prompt, decode.block_size) + fetch[0]
        transfer_bytes = 0
        if option.disaggregated:
            num_blocks = blocks_to_transfer(prompt, decode.block_size, num_held(option.decode_worker))
            transfer_bytes = num_blocks * decode_view.block_nbytes
        prediction = predict(
            prompt_tokens=prompt,
            max_tokens=request.max_tokens,
            prefill_cached_tokens=prefill_cached,
            prefill=prefill,
            decode=decode,
            transfer_bytes=transfer_bytes,
            link_bytes_per_s=self.link_bytes_per_s(),
            fetch_s=fetch[1],
        )
        if prediction is not None:
            prediction = self.calibration.apply(prediction, ttft_kind(option.disaggregated), TPOT, now)
        target_tpot_s = objective.tpot_ms / 1000 - self.calibration.offset(TPOT, now)
        recovery = tpot_recovery_s(decode, target_tpot_s, prompt, request.max_tokens)
        return dataclasses.replace(option, prediction=prediction, tpot_recovery_s=recovery)

    # -- what happened to planned requests -----------------------------------------------------------

    def dispatched(self, plan: Plan, now: float) -> int:
        """`plan` was sent to its workers: charge its load and let the routing policy record it.
        Returns the dispatch id the later calls name."""
        dispatch_id = self._next_dispatch_id
        self._next_dispatch_id += 1
        if plan.follows_router:
            self.router.record(plan.decision, now)
        self.ledger.dispatched(dispatch_id, plan.charges, now)
        if plan.prediction is not None:
            self.inflow.add(plan.prefill_worker or plan.decode_worker, plan.prediction.prefill_work_s, now)
        self._dispatched[dispatch_id] = plan
        if plan.probe == "trust":
            self._probing[plan.decode_worker] = dispatch_id
        prefill_discount_s = self.trust.excess_s(plan.prefill_worker, now) if plan.prefill_worker is not None else 0.0
        self._discount_at_dispatch[dispatch_id] = (self.trust.excess_s(plan.decode_worker, now), prefill_discount_s)
        return dispatch_id

    def prefill_ended(self, dispatch_id: int, now: float) -> None:
        self.ledger.prefill_ended(dispatch_id, now)

    def remote_prefill_ended(self, dispatch_id: int, now: float) -> None:
        self.ledger.remote_prefill_ended(dispatch_id, now)  # no-op for a request prefilled where it decodes

    def finished(self, dispatch_id: int, now: float, outcome: Outcome | None = None) -> None:
        """The request ended (outcome None: failed or cancelled, nothing learnt). Idempotent."""
        self.ledger.finished(dispatch_id, now)
        plan = self._dispatched.pop(dispatch_id, None)
        discounts_s = self._discount_at_dispatch.pop(dispatch_id, (0.0, 0.0))
        if plan is not None and self._probing.get(plan.decode_worker) == dispatch_id:
            del self._probing[plan.decode_worker]
        if plan is None or outcome is None:
            return
        self.link.observe(outcome.kv_transfer_bytes, outcome.kv_transfer_s, self._stated_link_bytes_per_s)
        p = plan.prediction
        if p is None:
            return
        # Learnt against the raw model: what was predicted before calibration (trust too: core/trust.py).
        if outcome.ttft_s is not None:
            raw_ttft_s = p.ttft_s - p.ttft_offset_s
            # The calibration learns what the model misses on every worker; a prediction that carried
            # a worker's discount misses by that discount (stale once its queue drained), which is
            # trust's to learn: calibrated with it, every worker's TTFT was predicted at 0 s after an
            # overload and predictive admission let the next one in (kvplane bench load).
            if not any(discounts_s):
                self.calibration.observe(ttft_kind(plan.disaggregated), raw_ttft_s, outcome.ttft_s, now)
            if not plan.disaggregated:  # prefilled where it decoded: the decode worker's reports alone predicted it
                self.trust.observe(plan.decode_worker, raw_ttft_s, outcome.ttft_s, now, discounts_s[0])
        if outcome.tpot_s is not None:
            self.calibration.observe(TPOT, p.tpot_s - p.tpot_offset_s, outcome.tpot_s, now)

    def decoding(self, dispatch_id: int, now: float, tpot_s: float) -> None:
        """A request still decoding has measured `tpot_s` so far (once, after EARLY_TPOT_TOKENS
        tokens): the TPOT calibration learns from it without waiting for the request to finish,
        which after a start or a load change takes a whole decode (tens of seconds) while
        admission keeps admitting on the old calibration."""
        plan = self._dispatched.get(dispatch_id)
        if plan is None or plan.prediction is None:
            return
        p = plan.prediction
        self.calibration.observe(TPOT, p.tpot_s - p.tpot_offset_s, tpot_s, now)

    def worker_stalled(self, worker_id: WorkerId, now: float) -> None:
        """A request on `worker_id` made no progress within its timeout: out of routing for a while."""
        self.health.stalled(worker_id, now)

    def worker_failed(self, worker_id: WorkerId, now: float) -> None:
        """A request failed because of `worker_id` (unreachable, unavailable): out of routing until it reports again."""
        self.health.failed(worker_id, now)

    def load_reported(self, worker_id: WorkerId, now: float, sampled_at: float | None = None) -> None:
        """A load report arrived at `now`; `sampled_at`: when the worker took it (same clock), if known."""
        self.ledger.reported(worker_id, now, sampled_at)

    def kv_stored(self, worker_id: WorkerId, block_hashes: Sequence[BlockHash]) -> None:
        self.router.on_kv_stored(worker_id, block_hashes)

    def worker_removed(self, worker_id: WorkerId) -> None:
        self.router.on_worker_removed(worker_id)
        self.ledger.forget_worker(worker_id)
        self.inflow.forget(worker_id)
        self.health.forget(worker_id)
        self.trust.forget(worker_id)
        self._probing.pop(worker_id, None)
