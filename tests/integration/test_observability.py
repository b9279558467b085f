"""Observability end to end: one trace across every process, Prometheus metrics that move, `kvplane top`.

The cluster's processes export their spans as JSON lines to one file (KVPLANE_TRACES_FILE,
batched every 50 ms); the SDK exports to OpenTelemetry's in-memory exporter in this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import urllib.request

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvplane import AsyncClient, Client
from kvplane.apps.cluster import LocalCluster
from kvplane.telemetry.metrics import SPECS

from .helpers import BLOCK_SIZE, metric_sum, prompt_ids, scrape, wait_for

pytestmark = pytest.mark.cluster  # starts processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    spans_file = tmp_path_factory.mktemp("traces") / "spans.jsonl"
    env = {"KVPLANE_TRACES_FILE": str(spans_file), "OTEL_BSP_SCHEDULE_DELAY": "50"}
    agent_args = ("--transports", "grpc", "--log-levels", "kvplane.dataplane.agent=DEBUG")
    with LocalCluster(num_prefill=1, num_decode=1, env=env, agent_args=agent_args, http_port=0,
                      controlplane_args=("--log-levels", "kvplane.controlplane=DEBUG")) as cluster:  # fmt: skip
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        with Client(cluster.endpoint, timeout=60, tracer_provider=provider) as client:
            yield cluster, client, exporter, spans_file


def _file_spans(path, trace_id: str) -> list[dict]:
    if not path.exists():
        return []
    spans = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [s for s in spans if s["trace_id"] == trace_id]


def test_one_disaggregated_request_is_one_trace_across_all_processes(traced):
    cluster, client, exporter, spans_file = traced
    prompt = prompt_ids(seed=41, length=6 * BLOCK_SIZE + 3)
    result = client.generate(prompt, max_tokens=5, disagg="always", ignore_eos=True)
    [root] = [s for s in exporter.get_finished_spans() if s.attributes.get("kvplane.request_id") == result.request_id]
    trace_id = format(root.context.trace_id, "032x")
    expected = {"kvplane.engine.decode", "kvplane.v1.Agent/PullKV", "kvplane.v1.Kvplane/Generate", "kvplane.engine.prefill"}
    spans = wait_for(
        lambda: (lambda got: got if expected <= {s["name"] for s in got} and len(got) >= 16 else None)(_file_spans(spans_file, trace_id)),
        timeout=10,
        what="the request's spans in the traces file",
    )
    by_id = {s["span_id"]: s for s in spans}
    root_id = format(root.context.span_id, "016x")

    def one(name: str, kind: str, instance: str) -> dict:
        found = [s for s in spans if s["name"] == name and s["kind"] == kind and s["instance"] == instance]
        assert len(found) == 1, (name, kind, instance, [(s["name"], s["kind"], s["instance"]) for s in spans])
        return found[0]

    cp = next(s["instance"] for s in spans if s["service"] == "kvplane-controlplane")
    cp_server = one("kvplane.v1.Kvplane/Generate", "SERVER", cp)
    route = one("kvplane.route", "INTERNAL", cp)
    admission = one("kvplane.admission", "INTERNAL", cp)
    cp_client = one("kvplane.v1.Agent/Generate", "CLIENT", cp)
    decode_server = one("kvplane.v1.Agent/Generate", "SERVER", "decode-0")
    remote = one("kvplane.remote_prefill", "INTERNAL", "decode-0")
    prefill_client = one("kvplane.v1.Agent/Prefill", "CLIENT", "decode-0")
    prefill_server = one("kvplane.v1.Agent/Prefill", "SERVER", "prefill-0")
    prefill_queue = one("kvplane.engine.queue", "INTERNAL", "prefill-0")
    prefill_compute = one("kvplane.engine.prefill", "INTERNAL", "prefill-0")
    transfer = one("kvplane.kv_transfer", "INTERNAL", "decode-0")
    pull_client = one("kvplane.v1.Agent/PullKV", "CLIENT", "decode-0")
    pull_server = one("kvplane.v1.Agent/PullKV", "SERVER", "prefill-0")
    decode_queue = one("kvplane.engine.queue", "INTERNAL", "decode-0")
    decode_prefill = one("kvplane.engine.prefill", "INTERNAL", "decode-0")
    decode = one("kvplane.engine.decode", "INTERNAL", "decode-0")

    parent_of = {
        cp_server["span_id"]: root_id,
        route["span_id"]: cp_server["span_id"],
        admission["span_id"]: cp_server["span_id"],
        cp_client["span_id"]: cp_server["span_id"],
        decode_server["span_id"]: cp_client["span_id"],
        remote["span_id"]: decode_server["span_id"],
        prefill_client["span_id"]: remote["span_id"],
        prefill_server["span_id"]: prefill_client["span_id"],
        prefill_queue["span_id"]: prefill_server["span_id"],
        prefill_compute["span_id"]: prefill_server["span_id"],
        transfer["span_id"]: remote["span_id"],
        pull_client["span_id"]: transfer["span_id"],
        pull_server["span_id"]: pull_client["span_id"],
        decode_queue["span_id"]: decode_server["span_id"],
        decode_prefill["span_id"]: decode_server["span_id"],
        decode["span_id"]: decode_server["span_id"],
    }
    assert {sid: by_id[sid]["parent_span_id"] for sid in parent_of} == parent_of
    assert {s["pid"] for s in spans} >= {cluster.processes[n].pid for n in ("controlplane", "prefill-0", "decode-0")}
    # Time order: queue before prefill, prefill (on the peer) before the transfer, transfer before decode.
    assert prefill_queue["end_ns"] <= prefill_compute["start_ns"]
    assert prefill_compute["end_ns"] <= transfer["start_ns"]
    assert transfer["end_ns"] <= decode["start_ns"]

    m = result.metrics
    assert root.attributes["rpc.system"] == "grpc" and root.attributes["gen_ai.usage.output_tokens"] == 5
    for rpc in (cp_server, cp_client, decode_server, prefill_client, prefill_server, pull_client, pull_server):
        a = rpc["attributes"]
        assert a["rpc.system"] == "grpc" and a["rpc.grpc.status_code"] == 0
        assert f"{a['rpc.service']}/{a['rpc.method']}" == rpc["name"]
    assert cp_server["attributes"]["gen_ai.usage.input_tokens"] == len(prompt)
    assert cp_server["attributes"]["kvplane.request_id"] == result.request_id
    assert route["attributes"]["kvplane.route.prefill_worker"] == "prefill-0"
    assert route["attributes"]["kvplane.route.disaggregated"] is True
    assert admission["attributes"]["kvplane.admission.decision"] == "admit"
    assert transfer["attributes"] == {
        "kvplane.kv_transfer.transport": "grpc",
        "kvplane.kv_transfer.bytes": m.kv_transfer_bytes,
        "kvplane.kv_transfer.blocks": m.kv_transfer_blocks,
    }
    assert m.kv_transfer_blocks == 6
    assert prefill_compute["attributes"]["gen_ai.usage.input_tokens"] == len(prompt)
    assert prefill_compute["attributes"]["kvplane.request.phase"] == "prefill"
    assert decode["attributes"]["gen_ai.usage.output_tokens"] == 5

    # The decode agent's per-request log line is JSON, carries this trace id, and no prompt text.
    def finished_line():
        for line in cluster.log_paths["decode-0"].read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("request_id") == result.request_id:
                return json.loads(line)
        return None

    event = wait_for(finished_line, timeout=5, what="the decode agent's 'generate finished' log line")
    assert event["msg"] == "generate finished" and event["trace_id"] == trace_id
    assert event["output_tokens"] == 5 and "prompt" not in json.dumps(event).replace("prompt_tokens", "")


@pytest.mark.parametrize("client_kind", ["blocking", "asyncio"])
def test_a_lookaside_request_is_one_trace_from_the_client_through_the_control_plane_and_the_agent(traced, client_kind):
    cluster, client, exporter, spans_file = traced
    prompt = prompt_ids(seed=43 if client_kind == "blocking" else 44, length=3 * BLOCK_SIZE)
    if client_kind == "blocking":  # reports by Report calls, the context in their metadata
        result = client.generate(prompt, max_tokens=4, ignore_eos=True, lookaside=True)
    else:  # reports on ReportStream, the context in each report
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))

        async def run():
            async with AsyncClient(cluster.endpoint, timeout=60, tracer_provider=provider) as aclient:
                return await aclient.generate(prompt, max_tokens=4, ignore_eos=True, lookaside=True)

        result = asyncio.run(run())
    [root] = [s for s in exporter.get_finished_spans() if s.attributes.get("kvplane.request_id") == result.request_id]
    assert root.attributes["gen_ai.usage.output_tokens"] == 4 and root.attributes["rpc.grpc.status_code"] == 0
    trace_id, root_id = format(root.context.trace_id, "032x"), format(root.context.span_id, "016x")
    expected = {"kvplane.v1.Kvplane/Route", "kvplane.route", "kvplane.admission", "kvplane.v1.Agent/Generate", "kvplane.v1.Kvplane/Report"}
    spans = wait_for(
        lambda: (lambda got: got if expected <= {s["name"] for s in got} else None)(_file_spans(spans_file, trace_id)),
        timeout=10,
        what="the lookaside request's spans in the traces file",
    )
    servers = {(s["name"], s["service"]): s for s in spans if s["kind"] == "SERVER"}
    place = servers["kvplane.v1.Kvplane/Route", "kvplane-controlplane"]
    run = servers["kvplane.v1.Agent/Generate", "kvplane-agent"]
    # The client called both directly: the control plane's Route and the agent's Generate are its children.
    assert place["parent_span_id"] == root_id and run["parent_span_id"] == root_id
    route = next(s for s in spans if s["name"] == "kvplane.route")
    assert (
        route["parent_span_id"] == place["span_id"] and route["attributes"]["kvplane.route.decode_worker"] == result.metrics.decode_worker
    )
    assert run["instance"] == result.metrics.decode_worker
    assert any(s["name"] == "kvplane.engine.decode" and s["parent_span_id"] == run["span_id"] for s in spans)
    reports = wait_for(
        lambda: (lambda got: got if len(got) == 2 else None)(
            [s for s in _file_spans(spans_file, trace_id) if s["name"] == "kvplane.v1.Kvplane/Report"]
        ),
        timeout=10,
        what="both lookaside reports' spans",
    )
    assert all(s["parent_span_id"] == root_id and s["kind"] == "SERVER" for s in reports)  # first token, end


def test_prometheus_endpoints_serve_documented_metrics_that_move(traced):
    cluster, client, _, _ = traced
    urls = {w.worker_id: w.metrics_url for w in client.workers()}
    cp_url = client.stats().metrics_url
    assert cp_url.startswith("http://127.0.0.1:") and all(u.startswith("http://127.0.0.1:") for u in urls.values())
    cp_before, decode_before = scrape(cp_url), scrape(urls["decode-0"])
    remote = client.generate(prompt_ids(seed=42, length=5 * BLOCK_SIZE + 1), max_tokens=4, disagg="always", ignore_eos=True)
    local = client.generate(prompt_ids(seed=43, length=20), max_tokens=4, disagg="never", ignore_eos=True)
    https = ssl.create_default_context(cafile=cluster.http_ca)  # the HTTP API serves HTTPS with the cluster's CA
    with urllib.request.urlopen(f"{cluster.http_url}/models", timeout=10, context=https) as response:  # the HTTP API counts too
        assert response.status == 200
    cp_after, decode_after, prefill_after = scrape(cp_url), scrape(urls["decode-0"]), scrape(urls["prefill-0"])

    ttft = "gen_ai_server_time_to_first_token_seconds_count"
    assert metric_sum(cp_after, ttft) - metric_sum(cp_before, ttft) == 2
    assert metric_sum(cp_after, ttft, kvplane_route_kind="remote") - metric_sum(cp_before, ttft, kvplane_route_kind="remote") == 1
    # One sample per relayed message after the first token: generate() asks for 16 tokens a message
    # (after the first alone), so each 4-token answer is two messages, one sample.
    itl = "kvplane_request_inter_token_latency_seconds_count"
    assert metric_sum(cp_after, itl) - metric_sum(cp_before, itl) == 2
    moved = "kvplane_kv_transfer_bytes_total"
    assert metric_sum(decode_after, moved) - metric_sum(decode_before, moved) == remote.metrics.kv_transfer_bytes > 0
    tokens = "kvplane_prompt_tokens_total"
    assert metric_sum(cp_after, tokens) - metric_sum(cp_before, tokens) == remote.metrics.prompt_tokens + local.metrics.prompt_tokens
    routed = "kvplane_routing_decisions_total"
    for kind in ("local", "remote"):
        assert metric_sum(cp_after, routed, kvplane_route_kind=kind) - metric_sum(cp_before, routed, kvplane_route_kind=kind) == 1
    admitted = "kvplane_admission_decisions_total"
    assert metric_sum(cp_after, admitted, kvplane_admission_decision="admit", kvplane_admission_reason="admitted") >= 2

    # Every documented metric is served by the process that records it (histograms as _count);
    # the decode agent records every agent metric (the transfer is counted on the pulling side).
    def served(samples, spec) -> bool:
        name = spec.prometheus_name + ("_count" if spec.kind == "histogram" else "")
        return any(k.split("{")[0] == name for k in samples)

    for spec in SPECS:
        assert served(cp_after if spec.where == "controlplane" else decode_after, spec), spec.prometheus_name
    assert metric_sum(decode_after, "kvplane_worker_kv_blocks", kvplane_kv_tier="device") > 0
    assert metric_sum(prefill_after, "kvplane_engine_prefill_duration_seconds_count", kvplane_request_phase="prefill") >= 1


def _kvplane(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "kvplane", *args], capture_output=True, text=True, timeout=60, env=env)


def test_top_json_once_and_workers_json_show_live_state(traced):
    cluster, client, _, _ = traced
    shared = prompt_ids(seed=44, length=4 * BLOCK_SIZE)
    client.generate(shared + [1, 2, 3], max_tokens=3, disagg="never")
    wait_for(lambda: client.route(shared + [4, 5], max_tokens=3, disagg="never").cached_tokens == len(shared),
             timeout=5, what="the first request's blocks in the index")  # fmt: skip
    second = client.generate(shared + [4, 5], max_tokens=3, disagg="never")
    assert second.metrics.cached_tokens == len(shared)

    top = _kvplane("top", "--json", "--once", "--endpoint", cluster.endpoint)
    assert top.returncode == 0, top.stderr
    snap = json.loads(top.stdout)
    rows = {w["id"]: w for w in snap["workers"]}
    assert set(rows) == {"prefill-0", "decode-0"}
    assert rows["prefill-0"]["role"] == "prefill" and rows["decode-0"]["role"] == "decode"
    decode = rows["decode-0"]
    assert decode["requests"] >= 2 and decode["ttft_ms"]["count"] >= 2 and decode["ttft_ms"]["p99"] > 0
    assert decode["itl_ms"]["count"] >= 4
    assert 0 < decode["cache_hit_rate"] < 1 and decode["cached_tokens"] >= len(shared)
    assert decode["kv"]["total_blocks"] > 0 and decode["kv"]["indexed_blocks_by_tier"]["device"] >= 4
    assert set(decode["load"]) == {"running", "waiting", "queued_prefill_tokens"}
    assert snap["controlplane_metrics_url"].startswith("http://")

    text = _kvplane("top", "--once", "--endpoint", cluster.endpoint)
    assert text.returncode == 0 and "TTFT p50/p99 ms" in text.stdout and "decode-0" in text.stdout

    workers = _kvplane("workers", "--json", "--endpoint", cluster.endpoint)
    assert workers.returncode == 0, workers.stderr
    for w in json.loads(workers.stdout):
        assert w["metrics_url"] == rows[w["id"]]["metrics_url"]
        assert "kvplane_worker_requests" in urllib.request.urlopen(w["metrics_url"], timeout=5).read().decode()
