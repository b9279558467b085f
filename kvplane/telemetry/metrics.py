"""Every metric kvplane records: name, kind, unit, attributes, buckets (the one source of truth).

Names follow OpenTelemetry's semantic conventions where one exists (gen_ai.server.* for the
serving latencies) and are `kvplane.*` otherwise. Latencies are histograms in seconds with
explicit buckets sized for LLM serving (1 ms .. 60 s; inter-token gaps from 0.5 ms). The
Prometheus exporter turns `a.b.c` with unit `s` into `a_b_c_seconds`, counters get `_total`.
Instruments are created against the global meter provider, a no-op until `setup()` installs one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry import metrics as otel_metrics

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Planning one request (route + admit): 0.1 ms .. 1 s, fine around the 1-5 ms where objectives lie.
PLANNING_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 1.0)
TOKEN_GAP_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: str  # "histogram" | "counter" | "gauge"
    unit: str  # UCUM, as OpenTelemetry wants: s, By, {token}, {request}, {block}
    where: str  # which process records it
    description: str
    attributes: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    observed: bool = False  # a counter read from a callback at collection (Instruments.observe_counters)

    @property
    def prometheus_name(self) -> str:
        base = self.name.replace(".", "_")
        suffix = {"s": "_seconds", "By": "_bytes"}.get(self.unit, "")
        if suffix and not base.endswith(suffix):
            base += suffix
        return base + ("_total" if self.kind == "counter" else "")


_MODEL, _KIND = "gen_ai.request.model", "kvplane.route.kind"
SPECS: tuple[MetricSpec, ...] = (
    # -- control plane: the request as its caller sees it ------------------------------------------
    MetricSpec("gen_ai.server.time_to_first_token", "histogram", "s", "controlplane",
               "Time from the control plane receiving Generate to relaying the first token (routing, admission, queue, prefill, KV transfer included).",
               (_MODEL, _KIND), LATENCY_BUCKETS_S),
    MetricSpec("kvplane.request.inter_token_latency", "histogram", "s", "controlplane",
               "Gap between consecutive output tokens as relayed to the caller: one sample per message after the first token, the mean gap of its tokens (a lookaside request: its reported time per output token, once).",
               (_MODEL,), TOKEN_GAP_BUCKETS_S),
    MetricSpec("gen_ai.server.time_per_output_token", "histogram", "s", "controlplane",
               "Per request: (end-to-end latency - time to first token) / (output tokens - 1).",
               (_MODEL,), TOKEN_GAP_BUCKETS_S),
    MetricSpec("gen_ai.server.request.duration", "histogram", "s", "controlplane",
               "End-to-end latency of Generate, from receipt to the last token (failed requests carry error.type).",
               (_MODEL, _KIND, "error.type"), LATENCY_BUCKETS_S),
    MetricSpec("kvplane.prompt.tokens", "counter", "{token}", "controlplane",
               "Prompt tokens of finished requests, by whether their KV came from the prefix cache or was computed.",
               (_MODEL, "kvplane.token.source")),
    MetricSpec("kvplane.output.tokens", "counter", "{token}", "controlplane",
               "Output tokens relayed to callers.", (_MODEL,)),
    MetricSpec("kvplane.admission.decisions", "counter", "{request}", "controlplane",
               "Admission decisions, by decision (admit, reject) and a bounded reason label.",
               ("kvplane.admission.decision", "kvplane.admission.reason")),
    MetricSpec("kvplane.routing.decisions", "counter", "{request}", "controlplane",
               "Routing decisions by kind: local (prefill on the decode worker), remote (prefill worker + KV transfer), fetched (cached KV pulled from a holder peer).",
               (_KIND,)),
    MetricSpec("kvplane.routing.duration", "histogram", "s", "controlplane",
               "Time to plan one request: route and admit (Generate and Route), the control plane's whole decision.",
               (), PLANNING_BUCKETS_S),
    MetricSpec("kvplane.controlplane.cpu", "counter", "s", "controlplane",
               "CPU seconds of the control plane's event loop by request-handling phase: route, admit (planning) and relay "
               "(the per-message work of relaying an agent's stream), report (lookaside mode's reports); the process's other CPU is gRPC, asyncio and the rest.",
               ("kvplane.phase",), observed=True),
    MetricSpec("kvplane.request.migrations", "counter", "{request}", "controlplane",
               "Requests moved to another decode worker mid-stream, by why (worker_failed, worker_stalled); the stream continued after the tokens already sent.",
               ("kvplane.migration.reason",)),
    MetricSpec("kvplane.lookaside.placements", "counter", "{request}", "controlplane",
               "Lookaside placements (the caller streams from the decode agent) by how they ended: finished, cancelled, failed, moved (continued on another worker), expired (the caller stopped reporting).",
               ("kvplane.lookaside.outcome",)),
    MetricSpec("kvplane.http.requests", "counter", "{request}", "controlplane",
               "Requests to the OpenAI-compatible HTTP API, by route and status code (499: the client went away).",
               ("http.route", "http.response.status_code")),
    # -- control plane: the cluster as this replica sees it (alerts: deploy/monitoring/) -------------
    MetricSpec("kvplane.controlplane.workers", "gauge", "{worker}", "controlplane",
               "Workers registered in the store as this replica sees them, by role (prefill, decode, both) and state (active, draining).",
               ("kvplane.worker.role", "kvplane.worker.state")),
    MetricSpec("kvplane.store.up", "gauge", "1", "controlplane",
               "1 while this replica's store probe (every 0.5 s) answers, 0 from its first failure until the next success."),
    MetricSpec("kvplane.bus.up", "gauge", "1", "controlplane",
               "1 while this replica's probe of the bus its load reports and KV events travel on (every 0.5 s) answers, 0 after a failure."),
    MetricSpec("kvplane.bus.messages", "counter", "{message}", "controlplane",
               "Load reports and KV-event batches this replica applied from the bus (not the store bus), by kind.",
               ("kvplane.bus.kind",), observed=True),
    MetricSpec("kvplane.bus.rejected", "counter", "{message}", "controlplane",
               "Bus messages this replica dropped: reason mac (missing or wrong MAC, checked with --bus-for-agents), replayed "
               "(a load report numbered at or below the last applied), invalid (a report the registry would refuse).",
               ("kvplane.bus.reason",), observed=True),
    MetricSpec("kvplane.bus.keepalives", "counter", "{request}", "controlplane",
               "Agents' lease keep-alives this replica took from the bus (--bus-for-agents), by outcome: renewed, lost (the lease "
               "had ended: the agent registers again), and those answered with an error, for which the agent asks over gRPC: mac "
               "(missing or wrong MAC), replayed (numbered at or below one answered), malformed, store (the store did not answer); noreply: published without a reply subject.",
               ("kvplane.bus.outcome",), observed=True),
    MetricSpec("kvplane.workers.discounted", "gauge", "{worker}", "controlplane",
               "Workers whose load reports this replica's planner discounts now: 2 of their last 8 requests took far longer than "
               "predicted from them (--report-contradiction-*); each is logged when it starts."),
    MetricSpec("kvplane.bus.held", "gauge", "{message}", "controlplane",
               "Bus messages held for a registration this replica's store watch has not shown yet (at most 10 s)."),
    MetricSpec("kvplane.kv_events.gaps", "counter", "{gap}", "controlplane",
               "Gaps this replica found in a worker's numbered KV-event batches (a lost batch); each asks the worker for a snapshot.",
               (), observed=True),
    # -- agents: the engine and the KV transfer ----------------------------------------------------
    MetricSpec("kvplane.engine.queue.duration", "histogram", "s", "agent",
               "Time a request waited in the engine's queue before admission (KV blocks reserved).",
               ("kvplane.request.phase",), LATENCY_BUCKETS_S),
    MetricSpec("kvplane.engine.prefill.duration", "histogram", "s", "agent",
               "Time from admission to the prompt's KV being computed (first token, or the end of a prefill for a peer).",
               ("kvplane.request.phase",), LATENCY_BUCKETS_S),
    MetricSpec("kvplane.kv_transfer.duration", "histogram", "s", "agent",
               "Decode side: time to pull the missing KV blocks of a remote prefill and commit them to the prefix cache.",
               ("kvplane.kv_transfer.transport",), LATENCY_BUCKETS_S),
    MetricSpec("kvplane.kv_transfer.bytes", "counter", "By", "agent",
               "KV bytes pulled from prefill peers (decode side).", ("kvplane.kv_transfer.transport",)),
    MetricSpec("kvplane.kv_transfer.blocks", "counter", "{block}", "agent",
               "KV blocks pulled from prefill peers (decode side).", ("kvplane.kv_transfer.transport",)),
    MetricSpec("kvplane.worker.requests", "gauge", "{request}", "agent",
               "Requests in the engine, by state (running, waiting).", ("kvplane.request.state",)),
    MetricSpec("kvplane.worker.queued_prefill_tokens", "gauge", "{token}", "agent",
               "Prompt tokens still to be computed by waiting and prefilling requests."),
    MetricSpec("kvplane.worker.lease_losses", "counter", "{lease}", "agent",
               "Leases this agent lost (expired in the store, or the control plane no longer knew it); each is followed by a re-registration."),
    MetricSpec("kvplane.worker.kv.blocks", "gauge", "{block}", "agent",
               "KV blocks by tier (device, host, disk) and state (used, cached = unreferenced but reusable, free).",
               ("kvplane.kv.tier", "kvplane.kv.state")),
)  # fmt: skip

SPEC_BY_NAME = {s.name: s for s in SPECS}


class Instruments:
    """The synchronous instruments, as attributes named after the metric (dots -> underscores)."""

    def __init__(self, meter: otel_metrics.Meter) -> None:
        self._meter = meter
        for spec in SPECS:
            attr = spec.name.replace(".", "_")
            if spec.kind == "histogram":
                inst = meter.create_histogram(spec.name, unit=spec.unit, description=spec.description,
                                              explicit_bucket_boundaries_advisory=list(spec.buckets))  # fmt: skip
            elif spec.kind == "counter" and not spec.observed:
                inst = meter.create_counter(spec.name, unit=spec.unit, description=spec.description)
            else:
                continue  # gauges and observed counters are read through callbacks: observe_gauges(), observe_counters()
            setattr(self, attr, inst)

    def observe_gauges(self, callbacks: dict[str, Callable[[], Iterable[tuple[float, dict]]]]) -> None:
        """Registers observable gauges: metric name -> callback returning (value, attributes) pairs."""
        self._observe(callbacks, self._meter.create_observable_gauge)

    def observe_counters(self, callbacks: dict[str, Callable[[], Iterable[tuple[float, dict]]]]) -> None:
        """Registers observed counters: metric name -> callback returning (running total, attributes) pairs."""
        self._observe(callbacks, self._meter.create_observable_counter)

    def _observe(self, callbacks: dict[str, Callable[[], Iterable[tuple[float, dict]]]], create) -> None:
        for name, fn in callbacks.items():
            spec = SPEC_BY_NAME[name]

            def callback(options, fn=fn):
                return [otel_metrics.Observation(v, a) for v, a in fn()]

            create(name, callbacks=[callback], unit=spec.unit, description=spec.description)


_instruments: Instruments | None = None


def instruments() -> Instruments:
    global _instruments
    if _instruments is None:
        _instruments = Instruments(otel_metrics.get_meter("kvplane"))
    return _instruments


def _reset_for_setup() -> None:
    """Instruments are re-made against the provider setup() installs."""
    global _instruments
    _instruments = None
