"""The one call path of both clients: what each RPC sends, and the deadline and retry rule every call follows.

A client method builds its call here without any I/O: a `UnaryCall` (the Kvplane method, its
request, the function that reads its answer, its rejection retries) or a `GenerateCall` (the one
server stream). The client's I/O loop then makes attempts until one succeeds, asking `Attempts`
after each failure whether to wait and try again or to raise. The rule (stated for users in the
`kvplane.client` docstring): the call's timeout bounds all its attempts and waits together; a
rejection (RESOURCE_EXHAUSTED) is retried at most `reject_retries` times, after the server's
retry-after hint, while that hint fits in the time left, and a stream only before its first message.

Failover: a client may know several control-plane replicas ("a:50051,b:50051"). A call that
cannot reach its replica (a connection failure, not an answer the replica sent) moves to the next
one at once, each replica tried once. A stream that loses its replica after messages arrived is
resumed (at most `max_resumes` times): the request goes again with the tokens already received
(`GenerateRequest.resume_token_ids`) and the stream continues after them.

Reconnecting (`Backoff`): once every replica has failed to answer, and before every resume, the
call waits and tries the next replica again, the waits growing exponentially with jitter (half
fixed, half random, capped at `max_s`), until the outage has lasted `window_s` or the call's
timeout would pass. So a replica that restarts within a few seconds is ridden through, and many
clients cut at once do not come back in one wave. (Before: a resume went out at once, and a
replica that was down for 0.3 s failed every call; issue 28.)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.message import Message
from opentelemetry import trace

from kvplane.client.from_proto import (
    cache_from_proto,
    chunk_from_proto,
    config_from_proto,
    drain_from_proto,
    profile_from_proto,
    route_from_proto,
    stats_from_proto,
    workers_from_proto,
)
from kvplane.client.request import build_profile_request
from kvplane.client.results import (
    ClusterStats,
    DrainResult,
    GenerateChunk,
    ProfileResult,
    RouteResult,
    WorkerCache,
    WorkerStatus,
)
from kvplane.errors import KvplaneError, RejectedError, from_rpc_error, is_connection_failure
from kvplane.telemetry import client_spans
from kvplane.v1 import client_pb2

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class UnaryCall(Generic[T]):
    """One unary RPC: `method` names the Kvplane stub method, `result` turns its answer into T."""

    method: str
    request: Message
    result: Callable[[Any], T]
    reject_retries: int = 0
    metadata: tuple[tuple[str, str], ...] | None = None  # e.g. a trace context (lookaside calls)


@dataclass(frozen=True, slots=True)
class GenerateCall:
    """The server-streaming Generate RPC; its answers become GenerateChunks."""

    request: client_pb2.GenerateRequest
    reject_retries: int = 0
    lookaside: bool = False  # stream from the decode agent itself (client/lookaside.py)


# -- one builder per RPC --------------------------------------------------------------------------


def generate(request: client_pb2.GenerateRequest, reject_retries: int, lookaside: bool = False) -> GenerateCall:
    return GenerateCall(request, reject_retries, lookaside)


def route(request: client_pb2.GenerateRequest, reject_retries: int) -> UnaryCall[RouteResult]:
    return UnaryCall("Route", request, route_from_proto, reject_retries)


def place(request: client_pb2.GenerateRequest, reject_retries: int, metadata=None) -> UnaryCall[client_pb2.RouteResponse]:
    """Lookaside mode's Route: `request` has `lookaside` set; the answer carries the Placement
    (kept as the message: client/lookaside.py reads it, the caller never sees it)."""
    return UnaryCall("Route", request, _itself, reject_retries, metadata)


def report(request: client_pb2.ReportRequest, metadata=None) -> UnaryCall[client_pb2.ReportResponse]:
    return UnaryCall("Report", request, _itself, 0, metadata)


def _itself(response: T) -> T:
    return response


def workers() -> UnaryCall[list[WorkerStatus]]:
    return UnaryCall("ListWorkers", client_pb2.ListWorkersRequest(), workers_from_proto)


def cache() -> UnaryCall[list[WorkerCache]]:
    return UnaryCall("GetCache", client_pb2.GetCacheRequest(), cache_from_proto)


def stats(window_s: float) -> UnaryCall[ClusterStats]:
    return UnaryCall("GetStats", client_pb2.GetStatsRequest(window_s=window_s), stats_from_proto)


def drain(worker_id: str) -> UnaryCall[DrainResult]:
    return UnaryCall("DrainWorker", client_pb2.DrainWorkerRequest(worker_id=worker_id), drain_from_proto)


def undrain(worker_id: str) -> UnaryCall[DrainResult]:
    return UnaryCall("UndrainWorker", client_pb2.DrainWorkerRequest(worker_id=worker_id), drain_from_proto)


def config() -> UnaryCall[dict[str, str]]:
    return UnaryCall("GetConfig", client_pb2.GetConfigRequest(), config_from_proto)


def set_config(key: str, value: str) -> UnaryCall[dict[str, str]]:
    return UnaryCall("SetConfig", client_pb2.SetConfigRequest(key=key, value=value), config_from_proto)


def profile(worker_id: str, max_prompt_tokens: int, max_batch: int) -> UnaryCall[ProfileResult]:
    request = build_profile_request(worker_id, max_prompt_tokens, max_batch)
    return UnaryCall("ProfileWorker", request, profile_from_proto)


# -- the deadline and retry rule ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backoff:
    """Waits between reconnect attempts in one outage (see the module docstring)."""

    initial_s: float = 0.1
    max_s: float = 2.0
    multiplier: float = 2.0
    window_s: float = 10.0  # an outage longer than this fails the call

    def delay(self, attempt: int, rand: Callable[[], float]) -> float:
        """The wait before reconnect attempt `attempt` (0-based): in [d/2, d], d = min(max_s, initial_s * multiplier^attempt)."""
        ceiling = min(self.max_s, self.initial_s * self.multiplier ** min(attempt, 64))
        return ceiling / 2 * (1 + rand())


RECONNECT = Backoff()


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


def split_endpoints(endpoints: str | Sequence[str]) -> tuple[str, ...]:
    """ "a:1,b:2" (or a sequence) -> ("a:1", "b:2"); ValueError for an empty list or item."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    parts = tuple(e.strip() for e in items)
    if not parts or not all(parts):
        raise ValueError(f"expected HOST:PORT or a comma-separated list of them, got {endpoints!r}")
    return parts


class Attempts:
    """The attempts of one call: the time left of its timeout, which replica to try, and what to
    do after each failure."""

    __slots__ = (
        "endpoints", "credentials", "reject_retries", "num_retries", "num_failovers", "num_reconnects", "backoff",
        "_index", "_end", "_clock", "_rand", "_outage_since",
    )  # fmt: skip

    def __init__(
        self,
        endpoint: str | Sequence[str],
        timeout: float | None,
        reject_retries: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        first: int = 0,
        credentials: str = "",
        backoff: Backoff = RECONNECT,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.endpoints = split_endpoints(endpoint)  # named in connection errors, so that they say where the call went
        self.credentials = credentials  # what the client presented, in words, for the same messages
        self.reject_retries = reject_retries
        self.num_retries = 0  # waits granted so far
        self.num_failovers = 0  # moves to another replica so far
        self.num_reconnects = 0  # backed-off attempts in the current outage
        self.backoff = backoff
        self._index = first % len(self.endpoints)
        self._clock = clock
        self._rand = rand
        self._end = None if timeout is None else clock() + timeout
        self._outage_since: float | None = None

    @property
    def endpoint(self) -> str:
        """The replica the next attempt goes to."""
        return self.endpoints[self._index]

    @property
    def index(self) -> int:
        return self._index

    def fail_over(self) -> None:
        """The next attempt goes to the next replica."""
        self._index = (self._index + 1) % len(self.endpoints)
        self.num_failovers += 1

    def reconnect_wait(self) -> float | None:
        """After a connection failure: the seconds to wait before trying the next replica again,
        or None when the outage has outlasted the back-off window or the call's timeout."""
        now = self._clock()
        if self._outage_since is None:
            self._outage_since = now
        wait = self.backoff.delay(self.num_reconnects, self._rand)
        remaining = self.timeout()
        if now - self._outage_since + wait > self.backoff.window_s or (remaining is not None and wait >= remaining):
            return None
        self.num_reconnects += 1
        self.fail_over()
        return wait

    def connected(self) -> None:
        """A message arrived: the outage, if any, is over."""
        self._outage_since = None
        self.num_reconnects = 0

    def timeout(self) -> float | None:
        """The timeout for the next attempt: what is left of the call's (None = no deadline)."""
        return None if self._end is None else max(0.0, self._end - self._clock())

    def wait_after(self, failure: grpc.RpcError, *, received: bool = False) -> float:
        """Seconds to wait before the next attempt; raises the failure as a KvplaneError when the call is over.

        `received`: the failed attempt had already delivered a stream message, so it is never retried.
        """
        if not received and is_connection_failure(failure):
            if self.num_failovers < len(self.endpoints) - 1:
                self.fail_over()
                return 0.0
            wait = self.reconnect_wait()
            if wait is not None:
                return wait
        where = self.endpoint if len(self.endpoints) == 1 else f"any of {', '.join(self.endpoints)}"
        error = from_rpc_error(failure, endpoint=where, credentials=self.credentials)
        wait = None
        if isinstance(error, RejectedError) and not received:
            wait = retry_wait(error, self.num_retries, self.reject_retries, self.timeout())
        if wait is None:
            raise error from failure
        self.num_retries += 1
        return wait


class GenerateProgress:
    """One Generate call across its attempts: its `Attempts`, what it has received, and its trace span.

    One span covers the whole call, retries included; `metadata` carries its context to the server.
    """

    __slots__ = ("attempts", "metadata", "max_resumes", "num_resumes", "_call", "_span", "_last", "_token_ids", "_failure", "_fresh")

    def __init__(self, call: GenerateCall, attempts: Attempts, tracer: trace.Tracer, max_resumes: int = 2) -> None:
        self.attempts = attempts
        self.max_resumes = max_resumes
        self.num_resumes = 0
        self._call = call
        self._span, self.metadata = client_spans.start_generate(tracer, attempts.endpoint, call.request)
        self._last: GenerateChunk | None = None
        self._token_ids: list[int] = []
        self._failure: grpc.RpcError | None = None
        self._fresh = False  # a message arrived since the last resume

    def request(self) -> client_pb2.GenerateRequest:
        """What the next attempt sends: the request, resumed after the tokens received so far."""
        if not self._token_ids:
            return self._call.request
        resumed = client_pb2.GenerateRequest()
        resumed.CopyFrom(self._call.request)
        resumed.resume_token_ids[:] = self._token_ids
        return resumed

    @property
    def finished(self) -> bool:
        """The final message has come: a failure after it (a replica lost before the call's
        status) is no reason to resume, which would get a second end."""
        return self._last is not None and self._last.finished

    def chunk(self, response: client_pb2.GenerateResponse) -> GenerateChunk:
        """The chunk for one received message, counted."""
        chunk = chunk_from_proto(response)
        self._last = chunk
        self._fresh = True
        self.attempts.connected()
        self._token_ids += chunk.token_ids
        return chunk

    def wait_after(self, failure: grpc.RpcError) -> float:
        """As Attempts.wait_after; a stream that has delivered a message is never retried, but
        one whose replica went away is resumed after what it delivered, on the next replica after
        a back-off. A resume that cannot connect either is the same outage, not another resume."""
        if self._last is not None and is_connection_failure(failure) and (not self._fresh or self.num_resumes < self.max_resumes):
            if self._fresh:
                self.num_resumes += 1
                self._fresh = False
            wait = self.attempts.reconnect_wait()
            if wait is not None:
                return wait
        try:
            return self.attempts.wait_after(failure, received=self._last is not None)
        except KvplaneError:
            self._failure = failure
            raise

    def end(self) -> None:
        client_spans.end_generate(self._span, self._last, len(self._token_ids), self._failure)
