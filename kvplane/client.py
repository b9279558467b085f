"""The kvplane client SDK: a blocking `Client` and an asyncio `AsyncClient` over the Kvplane service.

Both speak the same protocol (protos/kvplane/v1/client.proto) and return the same plain
dataclasses, so code can move between them without touching result handling. Arguments are
checked here only where the server cannot do it (a value that does not fit its wire type, a
disagg mode name, a priority class); everything else is the control plane's to validate, in one place.

Retrying a rejection: a RESOURCE_EXHAUSTED answer carries the server's retry-after hint. The
clients retry on it only when asked (`reject_retries`, on the constructor or per call): they
wait the hinted time and send the request again, at most that many times, and only while the
call's timeout leaves room for the wait (a hint longer than the time left ends the call with
the rejection at once, instead of a deadline error later). A stream is retried only before its
first message; after tokens have arrived a failure goes to the caller.
"""
from __future__ import annotations

import asyncio
import enum
import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType

import grpc

from kvplane.convert import disagg_to_pb, layout_from_pb, role_from_pb
from kvplane.errors import KvplaneError, RejectedError, from_rpc_error
from kvplane.telemetry import client_spans
from kvplane.types import DisaggMode, KVLayout, Role
from kvplane.v1 import client_pb2, client_pb2_grpc, common_pb2

ENDPOINT_ENV = "KVPLANE_ENDPOINT"
DEFAULT_ENDPOINT = "127.0.0.1:50051"

_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1

# Priority classes a request may name (client.proto GenerateRequest.priority); each has its
# own objectives. Batch requests may wait in the control plane's bounded queue.
PRIORITIES = ("interactive", "batch")
DEFAULT_PRIORITY = "interactive"


def resolve_endpoint(endpoint: str | None = None) -> str:
    """The explicit endpoint, else $KVPLANE_ENDPOINT, else 127.0.0.1:50051."""
    if endpoint:
        return endpoint
    return os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT


# ---------------------------------------------------------------------------------------------
# Results: plain dataclasses mirroring the protocol, so callers never touch protobuf objects.


class WorkerState(enum.Enum):
    UNSPECIFIED = "unspecified"
    ACTIVE = "active"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """What happened to one request (common.proto RequestMetrics plus its request id)."""

    prefill_worker: str = ""  # empty when prefill ran on the decode worker
    decode_worker: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_blocks: int = 0
    transport: str = ""
    ttft_ms: float = 0.0
    disaggregated: bool = False
    route_reason: str = ""
    prefill_computed_tokens: int = 0
    kv_transfer_ms: float = 0.0
    request_id: str = ""
    predicted_ttft_ms: float = 0.0  # admission's prediction when it admitted the request; 0 = none
    predicted_tpot_ms: float = 0.0
    priority: str = ""
    queued_ms: float = 0.0  # time a batch request waited in the admission queue
    kv_fetched_from: str = ""  # fetch instead of recompute: the worker whose cached prefix was pulled
    kv_fetched_tokens: int = 0


@dataclass(frozen=True, slots=True)
class GenerateChunk:
    """One streamed message: the tokens generated since the previous chunk."""

    token_ids: tuple[int, ...]
    text: str
    finished: bool
    finish_reason: str  # "length", "stop" or "eos" on the last chunk, else ""
    metrics: RequestMetrics | None  # set on the last chunk only
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class GenerateResult:
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    metrics: RequestMetrics

    @property
    def request_id(self) -> str:
        return self.metrics.request_id


@dataclass(frozen=True, slots=True)
class CandidateScore:
    worker_id: str
    cost: float
    cached_tokens: int
    admissible: bool
    note: str


@dataclass(frozen=True, slots=True)
class RouteResult:
    """A routing decision without running the request: which workers, and why."""

    request_id: str
    decode_worker: str
    prefill_worker: str  # empty when prefill would run on the decode worker
    disaggregated: bool
    reason: str
    prompt_tokens: int
    cached_tokens: int
    candidates: tuple[CandidateScore, ...]


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    num_running: int = 0
    num_waiting: int = 0
    num_queued_prefill_tokens: int = 0
    num_free_blocks: int = 0
    num_used_blocks: int = 0
    num_total_blocks: int = 0
    num_cached_blocks: int = 0


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    worker_id: str
    role: Role | None  # None when the worker registered without a role
    endpoint: str
    model: str
    state: WorkerState
    layout: KVLayout | None
    max_context: int
    vocab_size: int
    transports: tuple[str, ...]
    max_tokens_limit: int
    load: WorkerLoad
    load_age_s: float
    metrics_url: str = ""  # the agent's Prometheus endpoint


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Nearest-rank percentiles in milliseconds over a window's samples."""

    count: int = 0
    mean_ms: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """Recent requests of one worker as the control plane replica saw them."""

    worker_id: str
    num_requests: int
    ttft: LatencySummary
    itl: LatencySummary
    prompt_tokens: int
    cached_tokens: int
    kv_transfer_bytes: int

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True, slots=True)
class ClusterStats:
    workers: tuple[WorkerStats, ...]
    window_s: float
    metrics_url: str  # the replica's own Prometheus endpoint


@dataclass(frozen=True, slots=True)
class WorkerCache:
    worker_id: str
    blocks_by_tier: dict[str, int] = field(default_factory=dict)  # "device"/"host"/"disk" -> blocks


@dataclass(frozen=True, slots=True)
class DrainResult:
    worker_id: str
    state: WorkerState


@dataclass(frozen=True, slots=True)
class ProfileResult:
    """A worker's measured latency profile, as the control plane fitted and stored it.

    step_seconds = coefficients . (1, prefill_tokens, prefill_attention, decode_seqs,
    decode_context_tokens) (common.proto LatencyModel).
    """

    worker_id: str
    coefficients: tuple[float, ...]
    num_samples: int
    mean_abs_pct_error: float


# ---------------------------------------------------------------------------------------------
# Conversions between the dataclasses and protobuf, shared by both clients.

_STATE_FROM_PROTO = {
    common_pb2.WORKER_STATE_ACTIVE: WorkerState.ACTIVE,
    common_pb2.WORKER_STATE_DRAINING: WorkerState.DRAINING,
}


def build_request(
    prompt: str | Sequence[int],
    *,
    max_tokens: int = 16,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    disagg: str | DisaggMode = "auto",
    model: str = "",
    cache_salt: str = "",
    request_id: str = "",
    priority: str = DEFAULT_PRIORITY,
) -> client_pb2.GenerateRequest:
    """The GenerateRequest for these arguments; raises only for what cannot go on the wire."""
    sampling = common_pb2.SamplingParams(
        max_tokens=_unsigned("max_tokens", max_tokens, _UINT32_MAX),
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=_unsigned("top_k", top_k, _UINT32_MAX),
        stop_token_ids=[_unsigned("stop_token_ids[]", t, _UINT32_MAX) for t in stop_token_ids],
        ignore_eos=bool(ignore_eos),
    )
    if seed is not None:
        sampling.seed = _unsigned("seed", seed, _UINT64_MAX)
    request = client_pb2.GenerateRequest(
        model=model,
        sampling=sampling,
        disagg=_disagg_to_proto(disagg),
        request_id=request_id,
        cache_salt=cache_salt,
        priority=check_priority(priority),
    )
    if isinstance(prompt, str):
        request.text = prompt
    elif isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
        raise TypeError(f"prompt must be a str or a sequence of token ids, got {type(prompt).__name__}")
    else:
        request.token_ids.ids.extend(_unsigned("prompt token id", t, _UINT32_MAX) for t in prompt)
    return request


def _unsigned(name: str, value: int, maximum: int) -> int:
    # Negative or oversized values cannot be encoded as uint32/uint64, so the server never sees them.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise ValueError(f"{name} must be between 0 and {maximum}, got {value}")
    return value


def check_priority(priority: str) -> str:
    """`priority` if it names a priority class, else ValueError naming the accepted ones."""
    if not isinstance(priority, str) or priority not in PRIORITIES:
        accepted = ", ".join(map(repr, PRIORITIES))
        raise ValueError(f"priority must be one of {accepted}, got {priority!r}")
    return priority


def check_reject_retries(reject_retries: int) -> int:
    return _unsigned("reject_retries", reject_retries, _UINT32_MAX)


def retry_wait(error: RejectedError, attempt: int, reject_retries: int, remaining_s: float | None) -> float | None:
    """Seconds to wait before retry number `attempt + 1` of a rejected call; None = raise the rejection.

    None when the caller's retries are used up, the server gave no retry-after hint, or the
    hint does not fit in the time left of the call's timeout (`remaining_s`; None = no timeout).
    """
    hint = error.retry_after_s
    if attempt >= reject_retries or hint is None:
        return None
    if remaining_s is not None and hint >= remaining_s:
        return None
    return hint


class _Deadline:
    """The time left of one call's timeout, across its retries."""

    __slots__ = ("_end",)

    def __init__(self, timeout: float | None) -> None:
        self._end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        return None if self._end is None else max(0.0, self._end - time.monotonic())


def _disagg_to_proto(disagg: str | DisaggMode) -> int:
    try:
        return disagg_to_pb(DisaggMode(disagg))
    except (ValueError, TypeError):
        accepted = ", ".join(repr(m.value) for m in DisaggMode)
        raise ValueError(f"disagg must be one of {accepted}, got {disagg!r}") from None


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
                f"the generation stream ended before the request finished "
                f"({len(self._token_ids)} tokens received); retry the request",
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
        candidates=tuple(
            CandidateScore(c.worker_id, c.cost, c.cached_tokens, c.admissible, c.note)
            for c in response.candidates
        ),
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
        ),
        load_age_s=status.load_age_s,
        metrics_url=info.metrics_url,
    )


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
    return [WorkerCache(w.worker_id, dict(sorted(w.blocks_by_tier.items()))) for w in response.workers]


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


def build_profile_request(worker_id: str, max_prompt_tokens: int, max_batch: int) -> client_pb2.ProfileWorkerRequest:
    return client_pb2.ProfileWorkerRequest(
        worker_id=worker_id,
        max_prompt_tokens=_unsigned("max_prompt_tokens", max_prompt_tokens, _UINT32_MAX),
        max_batch=_unsigned("max_batch", max_batch, _UINT32_MAX),
    )


# ---------------------------------------------------------------------------------------------
# Clients.


class Client:
    """Blocking client. `timeout` (seconds) bounds every call, a whole generation and its retries included.

    `reject_retries`: how many times generate/stream/route retry a rejection after its
    retry-after hint (default 0: never); each of those calls may override it.
    Generate calls are traced with `tracer_provider` (default: OpenTelemetry's global one).
    """

    def __init__(
        self, endpoint: str | None = None, *, timeout: float | None = None, reject_retries: int = 0, tracer_provider=None
    ) -> None:
        self.endpoint = resolve_endpoint(endpoint)
        self.timeout = timeout
        self.reject_retries = check_reject_retries(reject_retries)
        self._tracer = client_spans.tracer_for(tracer_provider)
        self._channel = grpc.insecure_channel(self.endpoint)
        self._stub = client_pb2_grpc.KvplaneStub(self._channel)

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        disagg: str | DisaggMode = "auto",
        model: str = "",
        cache_salt: str = "",
        request_id: str = "",
        priority: str = DEFAULT_PRIORITY,
        reject_retries: int | None = None,
    ) -> GenerateResult:
        """Runs one request to completion and returns all its tokens and metrics."""
        request = build_request(
            prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, disagg=disagg,
            model=model, cache_salt=cache_salt, request_id=request_id, priority=priority,
        )  # fmt: skip
        retries = self._retries(reject_retries)
        assembler = StreamAssembler()
        for chunk in self._stream(request, retries):
            assembler.add(chunk)
        return assembler.result()

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        disagg: str | DisaggMode = "auto",
        model: str = "",
        cache_salt: str = "",
        request_id: str = "",
        priority: str = DEFAULT_PRIORITY,
        reject_retries: int | None = None,
    ) -> Iterator[GenerateChunk]:
        """Yields chunks as tokens arrive; the last has finished=True and the metrics.

        Arguments are checked now, not at the first next(); leaving the loop early cancels the request.
        """
        request = build_request(
            prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, disagg=disagg,
            model=model, cache_salt=cache_salt, request_id=request_id, priority=priority,
        )  # fmt: skip
        retries = self._retries(reject_retries)
        return self._stream(request, retries)

    def route(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        disagg: str | DisaggMode = "auto",
        model: str = "",
        cache_salt: str = "",
        request_id: str = "",
        priority: str = DEFAULT_PRIORITY,
        reject_retries: int | None = None,
    ) -> RouteResult:
        """The routing decision for this request, without running it."""
        request = build_request(
            prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, disagg=disagg,
            model=model, cache_salt=cache_salt, request_id=request_id, priority=priority,
        )  # fmt: skip
        retries = self._retries(reject_retries)
        return route_from_proto(self._unary(self._stub.Route, request, retries))

    def workers(self) -> list[WorkerStatus]:
        try:
            response = self._stub.ListWorkers(client_pb2.ListWorkersRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, endpoint=self.endpoint) from e
        return [worker_from_proto(w) for w in response.workers]

    def cache(self) -> list[WorkerCache]:
        try:
            return cache_from_proto(self._stub.GetCache(client_pb2.GetCacheRequest(), timeout=self.timeout))
        except grpc.RpcError as e:
            raise from_rpc_error(e, endpoint=self.endpoint) from e

    def stats(self, window_s: float = 0.0) -> ClusterStats:
        """Per-worker TTFT/ITL percentiles, cache hits and KV bytes of recent requests (0 = whole window)."""
        try:
            return stats_from_proto(self._stub.GetStats(client_pb2.GetStatsRequest(window_s=window_s), timeout=self.timeout))
        except grpc.RpcError as e:
            raise from_rpc_error(e, endpoint=self.endpoint) from e

    def drain(self, worker_id: str) -> DrainResult:
        """Stops new requests going to `worker_id`; running ones finish."""
        request = client_pb2.DrainWorkerRequest(worker_id=worker_id)
        try:
            return drain_from_proto(self._stub.DrainWorker(request, timeout=self.timeout))
        except grpc.RpcError as e:
            raise from_rpc_error(e, endpoint=self.endpoint) from e

    def config(self) -> dict[str, str]:
        """Every configuration key set in the cluster's store (admission policy, objectives, ...)."""
        return config_from_proto(self._unary(self._stub.GetConfig, client_pb2.GetConfigRequest()))

    def set_config(self, key: str, value: str) -> dict[str, str]:
        """Sets one key (an empty value restores its default); returns the whole resulting config."""
        request = client_pb2.SetConfigRequest(key=key, value=value)
        return config_from_proto(self._unary(self._stub.SetConfig, request))

    def profile(self, worker_id: str, *, max_prompt_tokens: int = 0, max_batch: int = 0) -> ProfileResult:
        """Measures a worker's latency profile (0 = the server's default bounds) and stores it."""
        request = build_profile_request(worker_id, max_prompt_tokens, max_batch)
        return profile_from_proto(self._unary(self._stub.ProfileWorker, request))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _retries(self, reject_retries: int | None) -> int:
        return self.reject_retries if reject_retries is None else check_reject_retries(reject_retries)

    def _unary(self, method, request, retries: int = 0):  # noqa: ANN001 - any unary stub method
        deadline = _Deadline(self.timeout)
        attempt = 0
        while True:
            try:
                return method(request, timeout=deadline.remaining())
            except grpc.RpcError as e:
                error = from_rpc_error(e, endpoint=self.endpoint)
                wait = retry_wait(error, attempt, retries, deadline.remaining()) if isinstance(error, RejectedError) else None
                if wait is None:
                    raise error from e
            time.sleep(wait)
            attempt += 1

    def _stream(self, request: client_pb2.GenerateRequest, retries: int = 0) -> Iterator[GenerateChunk]:
        deadline = _Deadline(self.timeout)
        attempt = 0
        # One span for the whole call, retries included.
        span, metadata = client_spans.start_generate(self._tracer, self.endpoint, request)
        chunk, num_tokens, failure = None, 0, None
        try:
            while True:
                call = self._stub.Generate(request, timeout=deadline.remaining(), metadata=metadata)
                received = False
                try:
                    for response in call:
                        received = True
                        chunk = chunk_from_proto(response)
                        num_tokens += len(chunk.token_ids)
                        yield chunk
                    return
                except grpc.RpcError as e:
                    error = from_rpc_error(e, endpoint=self.endpoint)
                    wait = None
                    if isinstance(error, RejectedError) and not received:
                        wait = retry_wait(error, attempt, retries, deadline.remaining())
                    if wait is None:
                        failure = e
                        raise error from e
                finally:
                    call.cancel()  # a no-op after completion; frees the workers when the caller stops early
                time.sleep(wait)
                attempt += 1
        finally:
            client_spans.end_generate(span, chunk, num_tokens, failure)


class AsyncClient:
    """asyncio client over grpc.aio; the same methods as `Client`, as coroutines.

    The channel is opened on first use, inside the running event loop that will drive it.
    """

    def __init__(
        self, endpoint: str | None = None, *, timeout: float | None = None, reject_retries: int = 0, tracer_provider=None
    ) -> None:
        self.endpoint = resolve_endpoint(endpoint)
        self.timeout = timeout
        self.reject_retries = check_reject_retries(reject_retries)
        self._tracer = client_spans.tracer_for(tracer_provider)
        self._channel: grpc.aio.Channel | None = None
        self._stub_instance: client_pb2_grpc.KvplaneStub | None = None

    async def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        disagg: str | DisaggMode = "auto",
        model: str = "",
        cache_salt: str = "",
        request_id: str = "",
        priority: str = DEFAULT_PRIORITY,
        reject_retries: int | None = None,
    ) -> GenerateResult:
        request = build_request(
            prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, disagg=disagg,
            model=model, cache_salt=cache_salt, request_id=request_id, priority=priority,
        )  # fmt: skip
        retries = self._retries(reject_retries)
        assembler = StreamAssembler()
        async for chunk in self._stream(request, retries):
            assembler.add(chunk)
        return assembler.result()

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        disagg: str | DisaggMode = "auto",
        model: str = "",
        cache_salt: str = "",
        request_id: str = "",
        priority: str = DEFAULT_PRIORITY,
        reject_retries: int | None = None,
    ) -> AsyncIterator[GenerateChunk]:
        """`async for chunk in client.stream(...)`; arguments are checked at the call."""
        request = build_request(
            prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, disagg=disagg,
            model=model, cache_salt=cache_salt, request_id=request_id, priority=priority,
        )  # fmt: skip
        retries = self._retries(reject_retries)
        return self._stream(request, retries)

    async def route(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        disagg: str | DisaggMode = "auto",
        model: str = "",
        cache_salt: str = "",
        request_id: str = "",
        priority: str = DEFAULT_PRIORITY,
        reject_retries: int | None = None,
    ) -> RouteResult:
        request = build_request(
            prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=seed, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, disagg=disagg,
            model=model, cache_salt=cache_salt, request_id=request_id, priority=priority,
        )  # fmt: skip
        retries = self._retries(reject_retries)
        return route_from_proto(await self._unary("Route", request, retries))

    async def workers(self) -> list[WorkerStatus]:
        try:
            response = await self._stub().ListWorkers(client_pb2.ListWorkersRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, endpoint=self.endpoint) from e
        return [worker_from_proto(w) for w in response.workers]

    async def cache(self) -> list[WorkerCache]:
        try:
            response = await self._stub().GetCache(client_pb2.GetCacheRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, endpoint=self.endpoint) from e
        return cache_from_proto(response)

    async def stats(self, window_s: float = 0.0) -> ClusterStats:
        try:
            response = await self._stub().GetStats(client_pb2.GetStatsRequest(window_s=window_s), timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, endpoint=self.endpoint) from e
        return stats_from_proto(response)

    async def drain(self, worker_id: str) -> DrainResult:
        request = client_pb2.DrainWorkerRequest(worker_id=worker_id)
        try:
            return drain_from_proto(await self._stub().DrainWorker(request, timeout=self.timeout))
        except grpc.RpcError as e:
            raise from_rpc_error(e, endpoint=self.endpoint) from e

    async def config(self) -> dict[str, str]:
        return config_from_proto(await self._unary("GetConfig", client_pb2.GetConfigRequest()))

    async def set_config(self, key: str, value: str) -> dict[str, str]:
        request = client_pb2.SetConfigRequest(key=key, value=value)
        return config_from_proto(await self._unary("SetConfig", request))

    async def profile(self, worker_id: str, *, max_prompt_tokens: int = 0, max_batch: int = 0) -> ProfileResult:
        request = build_profile_request(worker_id, max_prompt_tokens, max_batch)
        return profile_from_proto(await self._unary("ProfileWorker", request))

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub_instance = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _stub(self) -> client_pb2_grpc.KvplaneStub:
        if self._stub_instance is None:
            self._channel = grpc.aio.insecure_channel(self.endpoint)
            self._stub_instance = client_pb2_grpc.KvplaneStub(self._channel)
        return self._stub_instance

    def _retries(self, reject_retries: int | None) -> int:
        return self.reject_retries if reject_retries is None else check_reject_retries(reject_retries)

    async def _unary(self, method_name: str, request, retries: int = 0):  # noqa: ANN001
        deadline = _Deadline(self.timeout)
        attempt = 0
        while True:
            try:
                return await getattr(self._stub(), method_name)(request, timeout=deadline.remaining())
            except grpc.RpcError as e:
                error = from_rpc_error(e, endpoint=self.endpoint)
                wait = retry_wait(error, attempt, retries, deadline.remaining()) if isinstance(error, RejectedError) else None
                if wait is None:
                    raise error from e
            await asyncio.sleep(wait)
            attempt += 1

    async def _stream(self, request: client_pb2.GenerateRequest, retries: int = 0) -> AsyncIterator[GenerateChunk]:
        deadline = _Deadline(self.timeout)
        attempt = 0
        span, metadata = client_spans.start_generate(self._tracer, self.endpoint, request)
        chunk, num_tokens, failure = None, 0, None
        try:
            while True:
                call = self._stub().Generate(request, timeout=deadline.remaining(), metadata=metadata)
                received = False
                try:
                    async for response in call:
                        received = True
                        chunk = chunk_from_proto(response)
                        num_tokens += len(chunk.token_ids)
                        yield chunk
                    return
                except grpc.RpcError as e:
                    error = from_rpc_error(e, endpoint=self.endpoint)
                    wait = None
                    if isinstance(error, RejectedError) and not received:
                        wait = retry_wait(error, attempt, retries, deadline.remaining())
                    if wait is None:
                        failure = e
                        raise error from e
                finally:
                    call.cancel()
                await asyncio.sleep(wait)
                attempt += 1
        finally:
            client_spans.end_generate(span, chunk, num_tokens, failure)
