"""A real grpc.aio server implementing the Kvplane service with scripted answers, for SDK and CLI tests.

The prompt text picks the behaviour (see `ScriptedKvplane.Generate`); "reject-then-ok:K..."
is rejected (retry-after 50 ms) the first K times the server sees that exact text, then echoed;
"reject-fast" is always rejected with a 50 ms hint; draining worker "slow" takes 5 s. Every other
prompt is echoed back: its characters become token ids (ord), streamed two per message, and the last
message carries fixed metrics. A lookaside Route places the request on this same server, whose
Agent.Generate echoes it the same way; its reports are recorded (`reports`: which method, which
event). It runs on its own event loop in a background thread so that both the blocking client and
the asyncio client (and CLI subprocesses) can call it.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import tempfile
import threading
import time
from pathlib import Path

import grpc

from kvplane.errors import REASON_KEY, RETRY_AFTER_MS_KEY
from kvplane.security.local import CONTROLPLANE, LocalCredentials
from kvplane.v1 import agent_pb2, agent_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

METRICS = common_pb2.RequestMetrics(
    prefill_worker="prefill-0",
    decode_worker="decode-0",
    prompt_tokens=5,
    cached_tokens=2,
    kv_transfer_bytes=4096,
    kv_transfer_blocks=1,
    transport="grpc",
    ttft_ms=12.5,
    disaggregated=True,
    route_reason="remote prefill: 3 uncached tokens >= threshold",
    prefill_computed_tokens=3,
    kv_transfer_ms=0.75,
    predicted_ttft_ms=11.0,
    predicted_tpot_ms=2.5,
    priority="interactive",
    queued_ms=0.0,
)
WORKERS = (
    client_pb2.WorkerStatus(
        info=common_pb2.WorkerInfo(
            worker_id="prefill-0", role=common_pb2.ROLE_PREFILL, endpoint="127.0.0.1:7001",
            model="builtin-tiny", state=common_pb2.WORKER_STATE_ACTIVE, max_context=2048,
            vocab_size=256, transports=["grpc"], max_tokens_limit=1024,
            layout=common_pb2.KVLayout(model="builtin-tiny", num_layers=2, num_kv_heads=2, head_dim=16,
                                       dtype="float32", block_size=16),
        ),
        load=common_pb2.WorkerLoad(num_running=1, num_waiting=2, num_used_blocks=10, num_total_blocks=512),
        load_age_s=0.25,
    ),
    client_pb2.WorkerStatus(
        info=common_pb2.WorkerInfo(
            worker_id="decode-0", role=common_pb2.ROLE_DECODE, endpoint="127.0.0.1:7002",
            model="builtin-tiny", state=common_pb2.WORKER_STATE_DRAINING,
        ),
        out_of_routing="stalled a request 3.0 s ago",
    ),
)  # fmt: skip


FAST_RETRY_AFTER_MS = 50
PROFILE = common_pb2.LatencyModel(coefficients=[0.002, 1.5e-5, 1e-9, 4e-4, 2e-7], num_samples=48,
                                  mean_abs_pct_error=0.042, seeded_from_profile=True)  # fmt: skip
STATS = client_pb2.GetStatsResponse(
    workers=[client_pb2.WorkerStats(
        worker_id="decode-0", num_requests=3, prompt_tokens=30, cached_tokens=12, kv_transfer_bytes=8192,
        ttft=client_pb2.LatencySummary(count=3, mean_ms=10.0, p50_ms=9.0, p90_ms=12.0, p99_ms=12.5),
        itl=client_pb2.LatencySummary(count=20, mean_ms=2.0, p50_ms=1.5, p90_ms=3.0, p99_ms=4.0),
    )],
    window_s=60.0, metrics_url="http://127.0.0.1:9100/metrics",
)  # fmt: skip
CONFIG_KEYS = ("admission.policy",)  # and objectives.<model>.<priority>.<ttft_ms|tpot_ms>


class ScriptedKvplane(client_pb2_grpc.KvplaneServicer):
    def __init__(self) -> None:
        self.requests: list[client_pb2.GenerateRequest] = []
        self.arrivals: list[float] = []  # time.monotonic() of each Generate/Route call
        self.seen: collections.Counter[str] = collections.Counter()  # calls per prompt text
        self.config: dict[str, str] = {"admission.policy": "threshold"}
        self.profile_requests: list[client_pb2.ProfileWorkerRequest] = []
        self.stats_windows: list[float] = []
        self.cancelled = threading.Event()  # set when a "long" generation is cancelled by its client
        self.list_workers_delay_s = 0.0  # how long ListWorkers takes
        self.list_workers_started = self.list_workers_answered = 0  # calls begun; answered (not cancelled)
        self.endpoint = ""  # where lookaside placements send the caller (this server's Agent service)
        self.reports: list[tuple[str, int]] = []  # ("stream" or "call", ReportRequest.event) per lookaside report
        self.num_report_streams = 0
        self.report_stream = True  # False: ReportStream is UNIMPLEMENTED, as on an older control plane
        self.break_stream_on: int | None = None  # an event that ends the report stream (once) instead of being answered

    async def Generate(self, request, context):  # noqa: N802 - gRPC method name
        self._record(request)
        text = request.text
        if await self._reject_if_scripted(text, context) or await _abort_if_scripted(text, context):
            return
        if text == "long":
            try:
                for i in range(1000):
                    yield client_pb2.GenerateResponse(token_ids=[i % 200], text="x", request_id="req-long")
                    await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            return
        if text == "truncated":
            yield client_pb2.GenerateResponse(token_ids=[1], text="a", request_id="req-t")
            return
        if text == "lost-after-the-end":  # the replica died after its final message, before the call's status
            yield client_pb2.GenerateResponse(token_ids=[1, 2], text="ab", request_id="req-e")
            yield client_pb2.GenerateResponse(
                token_ids=[3], text="c", finished=True, finish_reason="length", metrics=METRICS, request_id="req-e"
            )
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
        if text == "midstream-error":
            yield client_pb2.GenerateResponse(token_ids=[1], text="a", request_id="req-m")
            await context.abort(grpc.StatusCode.UNAVAILABLE, "decode worker decode-0 went away")
        ids = list(request.token_ids.ids) if request.HasField("token_ids") else [ord(c) for c in text]
        ids = ids[: request.sampling.max_tokens]
        for start in range(0, len(ids), 2):
            part = ids[start : start + 2]
            yield client_pb2.GenerateResponse(token_ids=part, text="".join(map(chr, part)), request_id="req-1")
        yield client_pb2.GenerateResponse(finished=True, finish_reason="length", metrics=METRICS, request_id="req-1")

    async def Route(self, request, context):  # noqa: N802
        self._record(request)
        if await self._reject_if_scripted(request.text, context) or await _abort_if_scripted(request.text, context):
            return client_pb2.RouteResponse()
        if request.lookaside:
            agent_request = agent_pb2.AgentGenerateRequest(request_id="req-l", prompt_token_ids=[ord(c) for c in request.text])
            agent_request.sampling.CopyFrom(request.sampling)
            if request.text.startswith("remote"):  # prefilled on another worker (the echo agent only says so)
                agent_request.prefill_from.CopyFrom(agent_pb2.PrefillSource(worker_id="prefill-0", endpoint="unused"))
            placement = client_pb2.Placement(
                placement_id=f"p{len(self.requests)}", worker_id="decode-0", endpoint=self.endpoint,
                agent_request=agent_request.SerializeToString(), ticket_expires_in_s=30, first_token_timeout_s=10, token_timeout_s=10,
            )  # fmt: skip
            return client_pb2.RouteResponse(request_id="req-l", decode_worker="decode-0", placement=placement)
        return client_pb2.RouteResponse(
            request_id="req-r", decode_worker="decode-0", prefill_worker="prefill-0", disaggregated=True,
            reason="long uncached prompt", prompt_tokens=40, cached_tokens=16,
            candidates=[client_pb2.CandidateScore(worker_id="decode-0", cost=1.5, cached_tokens=16,
                                                  admissible=True, note="best")],
        )  # fmt: skip

    async def Report(self, request, context):  # noqa: N802
        self.reports.append(("call", request.event))
        return client_pb2.ReportResponse()

    async def ReportStream(self, request_iterator, context):  # noqa: N802
        if not self.report_stream:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        self.num_report_streams += 1
        async for request in request_iterator:
            if request.event == self.break_stream_on:
                self.break_stream_on = None
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the replica is shutting down")
            self.reports.append(("stream", request.event))
            yield client_pb2.ReportAnswer(placement_id=request.placement_id)

    async def ListWorkers(self, request, context):  # noqa: N802
        self.list_workers_started += 1
        await asyncio.sleep(self.list_workers_delay_s)  # a cancelled call ends here
        self.list_workers_answered += 1
        return client_pb2.ListWorkersResponse(workers=WORKERS)

    async def GetCache(self, request, context):  # noqa: N802
        return client_pb2.GetCacheResponse(
            workers=[client_pb2.WorkerCache(worker_id="decode-0", blocks_by_tier={"device": 7, "host": 3}, num_pinned_blocks=2)]
        )

    async def GetStats(self, request, context):  # noqa: N802
        self.stats_windows.append(request.window_s)
        return STATS

    async def DrainWorker(self, request, context):  # noqa: N802
        if request.worker_id == "slow":
            await asyncio.sleep(5)
        if request.worker_id not in {w.info.worker_id for w in WORKERS}:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no worker {request.worker_id!r}")
        return client_pb2.DrainWorkerResponse(worker_id=request.worker_id, state=common_pb2.WORKER_STATE_DRAINING)

    async def UndrainWorker(self, request, context):  # noqa: N802
        if request.worker_id not in {w.info.worker_id for w in WORKERS}:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no worker {request.worker_id!r}")
        return client_pb2.DrainWorkerResponse(worker_id=request.worker_id, state=common_pb2.WORKER_STATE_ACTIVE)

    async def GetConfig(self, request, context):  # noqa: N802
        return client_pb2.ConfigResponse(values=self.config)

    async def SetConfig(self, request, context):  # noqa: N802
        parts = request.key.split(".")
        objective = len(parts) == 4 and parts[0] == "objectives" and parts[2] in ("interactive", "batch") \
            and parts[3] in ("ttft_ms", "tpot_ms")  # fmt: skip
        if request.key not in CONFIG_KEYS and not objective:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown config key {request.key!r}")
        if request.value:
            self.config[request.key] = request.value
        else:
            self.config.pop(request.key, None)
        return client_pb2.ConfigResponse(values=self.config)

    async def ProfileWorker(self, request, context):  # noqa: N802
        self.profile_requests.append(request)
        if request.worker_id not in {w.info.worker_id for w in WORKERS}:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no worker {request.worker_id!r}")
        return client_pb2.ProfileWorkerResponse(worker_id=request.worker_id, model=PROFILE, num_samples=48)

    def _record(self, request: client_pb2.GenerateRequest) -> None:
        self.requests.append(request)
        self.arrivals.append(time.monotonic())
        self.seen[request.text] += 1

    async def _reject_if_scripted(self, text: str, context) -> bool:
        if text == "reject-fast" or (text.startswith("reject-then-ok:") and self.seen[text] <= int(text.split(":")[1])):
            context.set_trailing_metadata(((RETRY_AFTER_MS_KEY, str(FAST_RETRY_AFTER_MS)), (REASON_KEY, "tpot_slo")))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "predicted TPOT 80 ms > objective 50 ms")
        return False


class EchoAgent(agent_pb2_grpc.AgentServicer):
    """The decode agent of scripted lookaside placements: echoes the prompt, two tokens a message."""

    async def Generate(self, request, context):  # noqa: N802
        if request.report_prefill_done:
            yield agent_pb2.AgentGenerateResponse(remote_prefill_done=True)
        ids = list(request.prompt_token_ids)[: request.sampling.max_tokens or None]
        for start in range(0, len(ids), 2):
            part = ids[start : start + 2]
            yield agent_pb2.AgentGenerateResponse(token_ids=part, text="".join(map(chr, part)))
        yield agent_pb2.AgentGenerateResponse(finished=True, finish_reason="length", metrics=METRICS)


async def _abort_if_scripted(text: str, context) -> bool:
    if text == "reject":
        context.set_trailing_metadata(((RETRY_AFTER_MS_KEY, "1500"), (REASON_KEY, "ttft_slo")))
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no decode worker can meet the TTFT objective")
    if text == "reject-no-hint":
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded")
    if text == "invalid":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens must be > 0")
    if text == "precondition":
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no decode workers registered")
    if text == "unavailable":
        await context.abort(grpc.StatusCode.UNAVAILABLE, "all decode workers failed")
    if text == "internal":
        await context.abort(grpc.StatusCode.INTERNAL, "router crashed")
    if text == "slow":
        await asyncio.sleep(5)
    return False


class ScriptedServer:
    """Starts on a free loopback port; `.endpoint`, `.servicer` (for recorded requests), `stop()`.

    It serves mutual TLS with throw-away credentials published for its endpoint, as `kvplane up`
    does, so SDK clients made with no credentials find them."""

    def __init__(self) -> None:
        self._credentials_dir = Path(tempfile.mkdtemp(prefix="kvplane-scripted-"))
        self.credentials = LocalCredentials.create(self._credentials_dir)
        self.servicer = ScriptedKvplane()
        self.endpoint = ""
        self._loop = asyncio.new_event_loop()
        self._server: grpc.aio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="scripted-kvplane", daemon=True)

    def start(self) -> ScriptedServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self) -> None:
        self._server = grpc.aio.server()
        client_pb2_grpc.add_KvplaneServicer_to_server(self.servicer, self._server)
        agent_pb2_grpc.add_AgentServicer_to_server(EchoAgent(), self._server)
        server_side = self.credentials.for_identity(CONTROLPLANE)
        port = self._server.add_secure_port("127.0.0.1:0", server_side.server_credentials())
        await self._server.start()
        self.endpoint = self.servicer.endpoint = f"127.0.0.1:{port}"
        self.credentials.publish(self.endpoint)

    def stop(self) -> None:
        assert self._server is not None
        asyncio.run_coroutine_threadsafe(self._server.stop(grace=None), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self.credentials.remove()
        shutil.rmtree(self._credentials_dir, ignore_errors=True)
