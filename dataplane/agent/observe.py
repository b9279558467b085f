"""The agent's observability glue: engine timings to metrics and spans, load gauges, transfer totals.

Timing points of one engine request (time.monotonic()): submitted (the agent queues it),
admitted (the scheduler reserved its KV blocks; EngineOutput.admitted_at), first output (the
prompt's KV is computed: the first token, or the end of a prefill for a peer), finished.
queue = admitted - submitted, prefill = first output - admitted, decode = finished - first output.
Spans are recorded after the fact with those times, as children of the RPC's server span.
"""

from __future__ import annotations

import time

from kvplane.dataplane.engines.request import EngineOutput
from kvplane.telemetry import instruments, tracing
from kvplane.v1 import common_pb2

PHASE_GENERATE = "generate"  # a Generate request (decode, after a local or remote prefill)
PHASE_PREFILL = "prefill"  # a prefill for a peer


class EngineTimer:
    __slots__ = ("phase", "submitted", "admitted", "first_output", "num_output_tokens", "_attrs")

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.submitted = time.monotonic()
        self.admitted = 0.0
        self.first_output = 0.0
        self.num_output_tokens = 0
        self._attrs = {"kvplane.request.phase": phase}

    def on_output(self, out: EngineOutput) -> None:
        now = time.monotonic()
        self.num_output_tokens += len(out.new_token_ids)
        if not self.admitted and out.admitted_at:
            self.admitted = out.admitted_at
            instruments().kvplane_engine_queue_duration.record(self.admitted - self.submitted, self._attrs)
            tracing.record_span(tracing.SPAN_QUEUE, self.submitted, self.admitted, self._attrs)
        if not self.first_output and self.admitted and (out.new_token_ids or out.finished):
            self.first_output = now
            instruments().kvplane_engine_prefill_duration.record(now - self.admitted, self._attrs)
            if tracing.enabled():
                tracing.record_span(tracing.SPAN_PREFILL, self.admitted, now, {
                    **self._attrs,
                    "gen_ai.usage.input_tokens": out.num_prompt_tokens,
                    "kvplane.prompt.cached_tokens": out.num_cached_tokens,
                    "kvplane.prompt.computed_tokens": out.num_prompt_tokens - out.num_cached_tokens,
                })  # fmt: skip
        if out.finished and self.phase == PHASE_GENERATE and self.first_output and tracing.enabled():
            tracing.record_span(tracing.SPAN_DECODE, self.first_output, now, {
                "gen_ai.usage.output_tokens": self.num_output_tokens,
                "gen_ai.response.finish_reasons": [out.finish_reason or ""],
            })  # fmt: skip


def record_transfer(metrics: common_pb2.RequestMetrics) -> None:
    """Counts a finished remote prefill's pull on the decode side."""
    if not metrics.disaggregated:
        return
    attrs = {"kvplane.kv_transfer.transport": metrics.transport}
    inst = instruments()
    inst.kvplane_kv_transfer_duration.record(metrics.kv_transfer_ms / 1000, attrs)
    inst.kvplane_kv_transfer_bytes.add(metrics.kv_transfer_bytes, attrs)
    inst.kvplane_kv_transfer_blocks.add(metrics.kv_transfer_blocks, attrs)


def record_lease_loss() -> None:
    """The agent's lease was gone when it renewed or reported (it registers again)."""
    instruments().kvplane_worker_lease_losses.add(1)


def register_load_gauges(engine) -> None:
    """Worker load as observable gauges, read from the engine at each scrape or export."""

    def requests():
        load = engine.load()
        return [(load.num_running, {"kvplane.request.state": "running"}), (load.num_waiting, {"kvplane.request.state": "waiting"})]

    def queued():
        return [(engine.load().num_queued_prefill_tokens, {})]

    def blocks():
        load = engine.load()
        device = {"kvplane.kv.tier": "device"}
        return [
            (load.num_used_blocks, {**device, "kvplane.kv.state": "used"}),
            (load.num_cached_blocks, {**device, "kvplane.kv.state": "cached"}),
            (load.num_free_blocks - load.num_cached_blocks, {**device, "kvplane.kv.state": "free"}),
        ]

    instruments().kvplane_worker_lease_losses.add(0)  # the series exists from the start, at 0
    instruments().observe_gauges({
        "kvplane.worker.requests": requests,
        "kvplane.worker.queued_prefill_tokens": queued,
        "kvplane.worker.kv.blocks": blocks,
    })  # fmt: skip
