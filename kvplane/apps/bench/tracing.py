"""`kvplane bench tracing`: what tracing costs on the generate path, on real local clusters.

Two clusters of one prefill and one decode agent run side by side: one with tracing off (no
exporter configured: the default), one with tracing on (every process exports its spans through
OpenTelemetry's batch processor to a JSON-lines file, KVPLANE_TRACES_FILE, and the SDK traces
with its own provider to the same kind of file). The same requests go to both, alternating
request by request so that drift of the machine hits both alike. Each path is measured: local
(prefill on the decode worker) and remote (prefill worker + KV transfer). Reported: client-side
end-to-end latency per request (mean, p50, p99) and the ratio on/off, plus the cost of the
tracing hooks left on the request path when tracing is off (measured in-process).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

PATHS = ("never", "always")  # disagg modes: local prefill, remote prefill + transfer
PATH_NAMES = {"never": "local prefill", "always": "remote prefill + KV transfer"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=200, help="measured requests per path and mode (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured requests per path and mode first (default %(default)s)")
    parser.add_argument("--prompt-tokens", type=int, default=96, help="prompt length (default %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request (default %(default)s)")
    parser.add_argument("--json", action="store_true", help='print {"rows": [...], "off_path_hooks": {...}}')


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))]


def off_path_hook_cost(n: int = 200_000) -> dict[str, float]:
    """Nanoseconds per call of the hooks that stay on the request path when tracing is off."""
    from kvplane.telemetry import tracing

    assert not tracing.enabled()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with tracing.span(tracing.SPAN_ROUTE) as s:
            s.is_recording()
    t1 = time.perf_counter_ns()
    for _ in range(n):
        tracing.record_span(tracing.SPAN_QUEUE, 0.0, 0.0)
    t2 = time.perf_counter_ns()
    # Per request: 4 span() sites (route, admission, remote prefill, transfer) and up to 5
    # record_span() sites (queue and prefill on each engine, decode).
    span_ns, record_ns = (t1 - t0) / n, (t2 - t1) / n
    return {"span_ns": span_ns, "record_span_ns": record_ns, "per_request_us": (4 * span_ns + 5 * record_ns) / 1000}


def on_path_span_cost(n: int = 20_000) -> float:
    """Microseconds per span with tracing on (SDK tracer, batch processor, a discarding exporter)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    tracer = provider.get_tracer("bench")
    attributes = {"rpc.system": "grpc", "rpc.service": "kvplane.v1.Agent", "rpc.method": "Generate"}
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with tracer.start_as_current_span("kvplane.apps.bench", attributes=attributes):
            pass
    elapsed = time.perf_counter_ns() - t0
    provider.shutdown()
    return elapsed / n / 1000


def run(args: argparse.Namespace) -> int:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from kvplane import Client
    from kvplane.apps.cluster import LocalCluster
    from kvplane.telemetry.tracing import JsonLinesSpanExporter

    log = (lambda msg: None) if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    load_before = os.getloadavg()[0]
    hooks = off_path_hook_cost()
    span_us = on_path_span_cost()
    workdir = Path(tempfile.mkdtemp(prefix="kvplane-bench-tracing-"))
    spans_file = workdir / "spans.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(str(spans_file))))
    rng = random.Random(0)
    latencies: dict[tuple[str, str], list[float]] = {(p, m): [] for p in PATHS for m in ("off", "on")}
    agent_args = ("--num-blocks", "2048")
    log("starting two clusters (tracing off, tracing on) ...")
    with (
        LocalCluster(1, 1, agent_args=agent_args) as off,
        LocalCluster(1, 1, agent_args=agent_args, env={"KVPLANE_TRACES_FILE": str(spans_file)}) as on,
    ):
        with Client(off.endpoint, timeout=120) as off_client, Client(on.endpoint, timeout=120, tracer_provider=provider) as on_client:
            clients = {"off": off_client, "on": on_client}
            for i in range(args.warmup + args.requests):
                for path in PATHS:
                    # A fresh prompt each time (no prefix hits), the same one for both modes.
                    prompt = [rng.randrange(256) for _ in range(args.prompt_tokens)]
                    salt = f"bench-{i}-{path}"
                    for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
                        t0 = time.perf_counter()
                        result = clients[mode].generate(prompt, max_tokens=args.max_tokens, disagg=path, cache_salt=salt, ignore_eos=True)
                        elapsed = time.perf_counter() - t0
                        if len(result.token_ids) != args.max_tokens:
                            raise RuntimeError(f"request {i} returned {len(result.token_ids)} tokens")
                        if i >= args.warmup:
                            latencies[(path, mode)].append(elapsed * 1000)
                if (i + 1) % 50 == 0:
                    log(f"  {i + 1}/{args.warmup + args.requests} rounds")
    provider.shutdown()
    num_spans = sum(1 for _ in spans_file.open()) if spans_file.exists() else 0
    rows = []
    for path in PATHS:
        base = latencies[(path, "off")]
        base_mean, base_p50 = sum(base) / len(base), _pct(base, 50)
        for mode in ("off", "on"):
            values = latencies[(path, mode)]
            mean = sum(values) / len(values)
            rows.append({
                "path": PATH_NAMES[path], "tracing": mode, "requests": len(values), "mean_ms": mean,
                "p50_ms": _pct(values, 50), "p99_ms": _pct(values, 99),
                "mean_ratio": mean / base_mean, "p50_ratio": _pct(values, 50) / base_p50,
            })  # fmt: skip
    num_requests = sum(len(v) for (p, m), v in latencies.items() if m == "on") + args.warmup * len(PATHS)
    spans_per_request = num_spans / num_requests if num_requests else 0.0
    on_cost = {"us_per_span": span_us, "spans_per_request": spans_per_request, "per_request_us": span_us * spans_per_request}
    if args.json:
        print(json.dumps({"rows": rows, "off_path_hooks": hooks, "on_path_spans": on_cost, "spans_exported": num_spans,
                          "cpus": os.cpu_count(), "load_average": [load_before, os.getloadavg()[0]]}, indent=2))  # fmt: skip
        return 0
    print("| path | tracing | requests | mean ms | p50 ms | p99 ms | mean vs off | p50 vs off |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['path']} | {r['tracing']} | {r['requests']} | {r['mean_ms']:.2f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
              f"| {r['mean_ratio']:.3f}x | {r['p50_ratio']:.3f}x |")  # fmt: skip
    print()
    print(f"machine: {os.cpu_count()} CPUs, 1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"spans exported with tracing on: {num_spans} (about {spans_per_request:.1f} per request, SDK span included)")
    print(f"one span with tracing on: {span_us:.1f} us in-process, so about {on_cost['per_request_us']:.0f} us of span work per request")
    print(
        f"hooks left on the request path with tracing off: span() {hooks['span_ns']:.0f} ns, record_span() "
        f"{hooks['record_span_ns']:.0f} ns per call, about {hooks['per_request_us']:.2f} us per request"
    )
    return 0
