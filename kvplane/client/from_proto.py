"""Result-conversion core: protocol answers -> the SDK's dataclasses, shared by both clients.

Every answer of the Kvplane service has exactly one function here, named after what it returns,
so a client's I/O loop never reads a protobuf field itself. `StreamAssembler` joins a Generate
stream into one result and refuses a stream that ended without its final message.
"""

from __future__ import annotations

import grpc

from kvplane.client.results import (
    CandidateScore,
    ClusterStats,
    DrainResult,
    GenerateChunk,
    GenerateResult,
    LatencySummary,
    ProfileResult,
    RequestMetrics,
    RouteResult,
    WorkerCache,
    WorkerLoad,
    WorkerState,
    WorkerStats,
    WorkerStatus,
)
from kvplane.convert import layout_from_pb, role_from_pb
from kvplane.errors import KvplaneError
from kvplane.v1 import client_pb2, common_pb2

_STATE_FROM_PROTO = {
    common_pb2.WORKER_STATE_ACTIVE: WorkerState.ACTIVE,
    common_pb2.WORKER_STATE_DRAINING: WorkerState.DRAINING,
}


def metrics_from_proto(metrics: common_pb2.RequestMetrics, request_id: str = "") -> RequestMetrics:
    return RequestMetrics(
        prefill_worker=metrics.prefill_worker,
        decode_worker=metrics.decode_worker,
        prompt_tokens=metrics.prompt_tokens,
        cached_tokens=metrics.cached_tokens,
        kv_transfer_bytes=metrics.kv_transfer_bytes,
        kv_transfer_blocks=metrics.kv_transfer_blocks,
        transport=metrics.transport,
        ttft_ms=metrics.ttft_ms,
        disaggregated=metrics.disaggregated,
        route_reason=metrics.route_reason,
        prefill_computed_tokens=metrics.prefill_computed_tokens,
        kv_transfer_ms=metrics.kv_transfer_ms,
        request_id=request_id,
        predicted_ttft_ms=metrics.predicted_ttft_ms,
        predicted_tpot_ms=metrics.predicted_tpot_ms,
        priority=metrics.priority,
        queued_ms=metrics.queued_ms,
        kv_fetched_from=metrics.kv_fetched_from,
        kv_fetched_tokens=metrics.kv_fetched_tokens,
        num_migrations=metrics.num_migrations,
    )


def chunk_from_proto(response: client_pb2.GenerateResponse) -> GenerateChunk:
    metrics = None
    if response.HasField("metrics") or response.finished:
        metrics = metrics_from_proto(response.metrics, response.request_id)
    return GenerateChunk(
        token_ids=tuple(response.token_ids),
        text=response.text,
        finished=response.finished,
        finish_reason=response.finish_reason,
        metrics=metrics,
        request_id=response.request_id,
    )


class StreamAssembler:
    """Joins streamed chunks into one GenerateResult, insisting that the stream really finished."""

    __slots__ = ("_token_ids", "_texts", "_last")

    def __init__(self) -> None:
        self._token_ids: list[int] = []
        self._texts: list[str] = []
        self._last: GenerateChunk | None = None

    def add(self, chunk: GenerateChunk) -> None:
        if self._last is not None and self._last.finished:
            raise KvplaneError(grpc.StatusCode.INTERNAL, "the server sent tokens after the final message")
        self._token_ids.extend(chunk.token_ids)
        self._texts.append(chunk.text)
        self._last = chunk

    def result(self) -> GenerateResult:
        last = self._last
        if last is None or not last.finished:
            # A stream that ends cleanly but unfinished means the server lost the request.
            raise KvplaneError(
                grpc.StatusCode.UNKNOWN,
                f"the generation stream ended before the request finished ({len(self._token_ids)} tokens received); retry the request",
            )
        metrics = last.metrics or RequestMetrics(request_id=last.request_id)
        return GenerateResult(
            token_ids=tuple(self._token_ids),
            text="".join(self._texts),
            finish_reason=last.finish_reason,
            metrics=metrics,
        )


def route_from_proto(response: client_pb2.RouteResponse) -> RouteResult:
    return RouteResult(
        request_id=response.request_id,
        decode_worker=response.decode_worker,
        prefill_worker=response.prefill_worker,
        disaggregated=response.disaggregated,
        reason=response.reason,
        prompt_tokens=response.prompt_tokens,
        cached_tokens=response.cached_tokens,
        candidates=tuple(CandidateScore(c.worker_id, c.cost, c.cached_tokens, c.admissible, c.note) for c in response.candidates),
    )


def worker_from_proto(status: client_pb2.WorkerStatus) -> WorkerStatus:
    info, load = status.info, status.load
    layout = layout_from_pb(info.layout) if info.HasField("layout") else None
    return WorkerStatus(
        worker_id=info.worker_id,
        role=role_from_pb(info.role) if info.role != common_pb2.ROLE_UNSPECIFIED else None,
        endpoint=info.endpoint,
        model=info.model,
        state=_STATE_FROM_PROTO.get(info.state, WorkerState.UNSPECIFIED),
        layout=layout,
        max_context=info.max_context,
        vocab_size=info.vocab_size,
        transports=tuple(info.transports),
        max_tokens_limit=info.max_tokens_limit,
        load=WorkerLoad(
            num_running=load.num_running,
            num_waiting=load.num_waiting,
            num_queued_prefill_tokens=load.num_queued_prefill_tokens,
            num_free_blocks=load.num_free_blocks,
            num_used_blocks=load.num_used_blocks,
            num_total_blocks=load.num_total_blocks,
            num_cached_blocks=load.num_cached_blocks,
            num_pinned_blocks=load.num_pinned_blocks,
        ),
        load_age_s=status.load_age_s,
        metrics_url=info.metrics_url,
        out_of_routing=status.out_of_routing,
    )


def workers_from_proto(response: client_pb2.ListWorkersResponse) -> list[WorkerStatus]:
    return [worker_from_proto(w) for w in response.workers]


def _summary_from_proto(s: client_pb2.LatencySummary) -> LatencySummary:
    return LatencySummary(s.count, s.mean_ms, s.p50_ms, s.p90_ms, s.p99_ms)


def stats_from_proto(response: client_pb2.GetStatsResponse) -> ClusterStats:
    workers = tuple(
        WorkerStats(w.worker_id, w.num_requests, _summary_from_proto(w.ttft), _summary_from_proto(w.itl),
                    w.prompt_tokens, w.cached_tokens, w.kv_transfer_bytes)
        for w in response.workers
    )  # fmt: skip
    return ClusterStats(workers, response.window_s, response.metrics_url)


def cache_from_proto(response: client_pb2.GetCacheResponse) -> list[WorkerCache]:
    return [WorkerCache(w.worker_id, dict(sorted(w.blocks_by_tier.items())), w.num_pinned_blocks) for w in response.workers]


def drain_from_proto(response: client_pb2.DrainWorkerResponse) -> DrainResult:
    return DrainResult(response.worker_id, _STATE_FROM_PROTO.get(response.state, WorkerState.UNSPECIFIED))


def profile_from_proto(response: client_pb2.ProfileWorkerResponse) -> ProfileResult:
    model = response.model
    return ProfileResult(
        worker_id=response.worker_id,
        coefficients=tuple(model.coefficients),
        num_samples=response.num_samples or model.num_samples,
        mean_abs_pct_error=model.mean_abs_pct_error,
    )


def config_from_proto(response: client_pb2.ConfigResponse) -> dict[str, str]:
    return dict(sorted(response.values.items()))
