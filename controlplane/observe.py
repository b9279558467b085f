"""The control plane's observability glue: per-request timings, routing and admission counts.

One `RequestObservation` follows a Generate call: the time it arrived, each relayed message
(time to first token, gaps between tokens), and the final RequestMetrics. It records the
metrics in kvplane.telemetry.metrics.SPECS (where = controlplane) and adds the request to the
replica's StatsWindow, which GetStats serves to `kvplane top`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from itertools import repeat

from opentelemetry import trace

from kvplane.controlplane.core.admission_base import Admit, Reject
from kvplane.controlplane.core.planner import Plan
from kvplane.telemetry import instruments, tracing
from kvplane.telemetry.window import StatsWindow
from kvplane.v1 import common_pb2

log = logging.getLogger(__name__)

ROUTE_LOCAL, ROUTE_REMOTE, ROUTE_FETCHED = "local", "remote", "fetched"

# CPU by phase: thread CPU seconds (time.thread_time(), ~1 us a reading) of the event loop's thread
# around synchronous sections only, so no other coroutine's work is counted; plain floats added
# here and read by the metric's callback at collection (kvplane_controlplane_cpu_seconds_total).
PHASE_ROUTE, PHASE_ADMIT, PHASE_RELAY, PHASE_REPORT = "route", "admit", "relay", "report"
cpu_seconds: dict[str, float] = dict.fromkeys((PHASE_ROUTE, PHASE_ADMIT, PHASE_RELAY, PHASE_REPORT), 0.0)
_cpu_counter_for: object = None  # the Instruments the counter was registered with


def register_cpu_counter() -> None:
    """Exports `cpu_seconds` (once per meter provider, however many services a process builds)."""
    global _cpu_counter_for
    inst = instruments()
    if _cpu_counter_for is not inst:
        _cpu_counter_for = inst
        inst.observe_counters({"kvplane.controlplane.cpu": lambda: [(s, {"kvplane.phase": p}) for p, s in cpu_seconds.items()]})


def register_keepalive_counter(outcomes: Callable[[], Mapping[str, int]]) -> None:
    """What became of the agents' keep-alives this replica took from the bus (bus_keepalives.py;
    every outcome 0 on a replica that takes none)."""
    instruments().observe_counters(
        {"kvplane.bus.keepalives": lambda: [(n, {"kvplane.bus.outcome": outcome}) for outcome, n in outcomes().items()]}
    )


def register_cluster_gauges(state) -> None:
    """The cluster as this replica's ClusterState sees it, read at each scrape: workers by role and
    state, whether the store answers, KV-event gaps found (deploy/monitoring/ alerts on these)."""
    from kvplane.v1 import common_pb2  # noqa: PLC0415

    def workers():
        counts = {(r, s): 0 for r in ("prefill", "decode", "both") for s in ("active", "draining")}
        for entry in state.workers.values():
            role = common_pb2.Role.Name(entry.info.role).removeprefix("ROLE_").lower()
            draining = entry.state == common_pb2.WORKER_STATE_DRAINING
            key = (role, "draining" if draining else "active")
            counts[key] = counts.get(key, 0) + 1
        return [(n, {"kvplane.worker.role": r, "kvplane.worker.state": s}) for (r, s), n in counts.items()]

    inst = instruments()
    inst.observe_gauges({
        "kvplane.controlplane.workers": workers,
        "kvplane.store.up": lambda: [(1 if state.store_ok else 0, {})],
        "kvplane.bus.up": lambda: [(1 if state.bus_ok else 0, {})],
        "kvplane.bus.held": lambda: [(state.num_bus_held, {})],
    })  # fmt: skip
    inst.observe_counters({
        "kvplane.kv_events.gaps": lambda: [(state.num_gaps_detected, {})],
        "kvplane.bus.messages": lambda: [(n, {"kvplane.bus.kind": kind}) for kind, n in state.bus_messages.items()],
        "kvplane.bus.rejected": lambda: [(n, {"kvplane.bus.reason": reason}) for reason, n in state.bus_rejected.items()],
    })  # fmt: skip


def register_planner_gauges(planner, clock) -> None:
    """What this replica's planner holds against workers, read at each scrape."""
    instruments().observe_gauges({"kvplane.workers.discounted": lambda: [(planner.trust.num_discounted(clock()), {})]})


def record_planning(seconds: float) -> None:
    """One request's route + admit wall time."""
    instruments().kvplane_routing_duration.record(seconds)


def route_kind(plan: Plan) -> str:
    """local: prefill on the decode worker; remote: a prefill worker plus KV transfer; fetched:
    the decode worker pulls a cached prefix from a holder peer (a plan carrying `fetch_from`)."""
    if plan.fetch_from:
        return ROUTE_FETCHED
    return ROUTE_REMOTE if plan.disaggregated else ROUTE_LOCAL


def reason_label(verdict: Plan | Admit | Reject) -> str:
    """'admitted', or the rejection's kind as a bounded label (RejectKind.label)."""
    return verdict.kind.label if isinstance(verdict, Reject) else "admitted"


def record_admission(verdict: Plan | Admit | Reject, policy: str, count: bool = True) -> None:
    """Counts the decision (count=False for Route, which runs nothing) and annotates the current span."""
    decision = "reject" if isinstance(verdict, Reject) else "admit"
    label = reason_label(verdict)
    if count:
        instruments().kvplane_admission_decisions.add(1, {"kvplane.admission.decision": decision, "kvplane.admission.reason": label})
    if tracing.enabled():
        span = trace.get_current_span()
        span.set_attributes({"kvplane.admission.decision": decision, "kvplane.admission.reason": label, "kvplane.admission.policy": policy})
        if isinstance(verdict, Reject):
            span.set_attributes({"kvplane.admission.detail": verdict.reason, "kvplane.admission.retry_after_s": verdict.retry_after_s})


def record_migration(reason: str, count: int = 1) -> None:
    """A request moved to another decode worker mid-stream (reason: core.failover.Failure value);
    count=0 declares the series, so that a scrape shows it at 0 before the first migration."""
    instruments().kvplane_request_migrations.add(count, {"kvplane.migration.reason": reason})


class RequestObservation:
    __slots__ = (
        "_window",
        "request_id",
        "started",
        "model",
        "kind",
        "first_token_at",
        "last_token_at",
        "gaps",
        "num_output_tokens",
        "_attrs",
    )

    def __init__(self, window: StatsWindow) -> None:
        self._window = window
        self.request_id = ""
        self.started = time.monotonic()
        self.model = ""
        self.kind = ""
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.gaps: list[float] = []
        self.num_output_tokens = 0
        self._attrs: dict = {}

    def routed(self, request_id: str, model: str, plan: Plan) -> None:
        self.request_id, self.model, self.kind = request_id, model, route_kind(plan)
        self._attrs = {"gen_ai.request.model": model}
        instruments().kvplane_routing_decisions.add(1, {"kvplane.route.kind": self.kind})
        if tracing.enabled():
            span = trace.get_current_span()
            span.set_attributes({
                "kvplane.request_id": request_id,
                "gen_ai.operation.name": "text_completion",
                "gen_ai.request.model": model,
                "kvplane.route.kind": self.kind,
            })  # fmt: skip

    def on_reply(self, num_tokens: int) -> None:
        if not num_tokens:
            return
        now = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = now
        else:
            # One histogram sample per message, its tokens' mean gap (they arrived together): a
            # sample per token cost a record each, 5.8 us, 255 of them for a 256-token answer.
            gap = (now - self.last_token_at) / num_tokens
            instruments().kvplane_request_inter_token_latency.record(gap, self._attrs)
            self.gaps.extend(repeat(gap, num_tokens))
        self.last_token_at = now
        self.num_output_tokens += num_tokens

    def tokens_reported(self, num_tokens: int, tpot_s: float) -> None:
        """A lookaside request's tokens, as its caller reported them (this replica saw none
        stream by): `num_tokens` in all, `tpot_s` apart after the first."""
        if num_tokens > 1 and tpot_s > 0:
            instruments().kvplane_request_inter_token_latency.record(tpot_s, self._attrs)  # one report, one sample
            self.gaps.extend(repeat(tpot_s, num_tokens - 1))
        self.num_output_tokens = num_tokens

    def finished(self, m: common_pb2.RequestMetrics) -> None:
        now = time.monotonic()
        inst = instruments()
        ttft = self.first_token_at - self.started if self.first_token_at is not None else None
        attrs = {**self._attrs, "kvplane.route.kind": self.kind}
        if ttft is not None:
            inst.gen_ai_server_time_to_first_token.record(ttft, attrs)
        inst.gen_ai_server_request_duration.record(now - self.started, attrs)
        if self.num_output_tokens > 1 and ttft is not None:
            inst.gen_ai_server_time_per_output_token.record((now - self.started - ttft) / (self.num_output_tokens - 1), self._attrs)
        inst.kvplane_prompt_tokens.add(m.cached_tokens, {**self._attrs, "kvplane.token.source": "cached"})
        inst.kvplane_prompt_tokens.add(m.prompt_tokens - m.cached_tokens, {**self._attrs, "kvplane.token.source": "computed"})
        inst.kvplane_output_tokens.add(self.num_output_tokens, self._attrs)
        self._window.add_request(m.decode_worker, m.prefill_worker, ttft, self.gaps, m.prompt_tokens, m.cached_tokens, m.kv_transfer_bytes)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request finished", extra={
                "request_id": self.request_id, "decode_worker": m.decode_worker, "prefill_worker": m.prefill_worker,
                "route_kind": self.kind, "prompt_tokens": m.prompt_tokens, "cached_tokens": m.cached_tokens,
                "output_tokens": self.num_output_tokens, "ttft_ms": round((ttft or 0.0) * 1000, 3),
                "duration_ms": round((now - self.started) * 1000, 3), "kv_transfer_bytes": m.kv_transfer_bytes,
            })  # fmt: skip
        if tracing.enabled():
            trace.get_current_span().set_attributes({
                "gen_ai.usage.input_tokens": m.prompt_tokens,
                "gen_ai.usage.output_tokens": self.num_output_tokens,
                "kvplane.prompt.cached_tokens": m.cached_tokens,
                "kvplane.decode_worker": m.decode_worker,
                "kvplane.prefill_worker": m.prefill_worker,
                "kvplane.ttft_ms": (ttft or 0.0) * 1000,
            })  # fmt: skip

    def failed(self, error_type: str) -> None:
        log.debug("request failed", extra={"request_id": self.request_id, "error_type": error_type, "route_kind": self.kind})
        attrs = {**self._attrs, "kvplane.route.kind": self.kind, "error.type": error_type}
        instruments().gen_ai_server_request_duration.record(time.monotonic() - self.started, attrs)
