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

Lookaside mode (`lookaside=True` on generate/stream): the control plane places the request and
the client streams it from the decode worker's agent, reporting back (`lookaside`); same
results, same errors, and a failed worker moves the request as in relay mode.

Layout: one core, two thin I/O shells. `request` builds requests (`RequestOptions`, checked once),
`from_proto` turns answers into the dataclasses of `results`, `calls` describes each RPC and holds
the deadline and retry rule, `lookaside` holds a lookaside call's state, `core.ClientCore` turns
method arguments into calls; `sync.Client` and `aio.AsyncClient` only run those calls over grpc
and grpc.aio.
"""

from __future__ import annotations

from kvplane.client.aio import AsyncClient
from kvplane.client.calls import retry_wait
from kvplane.client.core import DEFAULT_ENDPOINT, ENDPOINT_ENV, resolve_endpoint
from kvplane.client.from_proto import (
    StreamAssembler,
    cache_from_proto,
    chunk_from_proto,
    config_from_proto,
    drain_from_proto,
    metrics_from_proto,
    profile_from_proto,
    route_from_proto,
    stats_from_proto,
    worker_from_proto,
    workers_from_proto,
)
from kvplane.client.request import (
    DEFAULT_PRIORITY,
    RequestFields,
    RequestOptions,
    build_profile_request,
    build_request,
    check_priority,
    check_reject_retries,
)
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
from kvplane.client.sync import Client
from kvplane.types import PRIORITIES

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_PRIORITY",
    "ENDPOINT_ENV",
    "PRIORITIES",
    "AsyncClient",
    "CandidateScore",
    "Client",
    "ClusterStats",
    "DrainResult",
    "GenerateChunk",
    "GenerateResult",
    "LatencySummary",
    "ProfileResult",
    "RequestFields",
    "RequestMetrics",
    "RequestOptions",
    "RouteResult",
    "StreamAssembler",
    "WorkerCache",
    "WorkerLoad",
    "WorkerState",
    "WorkerStats",
    "WorkerStatus",
    "build_profile_request",
    "build_request",
    "cache_from_proto",
    "check_priority",
    "check_reject_retries",
    "chunk_from_proto",
    "config_from_proto",
    "drain_from_proto",
    "metrics_from_proto",
    "profile_from_proto",
    "resolve_endpoint",
    "retry_wait",
    "route_from_proto",
    "stats_from_proto",
    "worker_from_proto",
    "workers_from_proto",
]
