"""kvplane: control plane and data plane for prefill/decode disaggregated LLM serving.

The client SDK is importable from here: `kvplane.Client`, `kvplane.AsyncClient` and the errors.
"""
from kvplane.client import (
    AsyncClient,
    Client,
    GenerateChunk,
    GenerateResult,
    RequestMetrics,
    RouteResult,
    WorkerCache,
    WorkerStatus,
)
from kvplane.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    KvplaneError,
    NotFoundError,
    RejectedError,
    UnavailableError,
    from_rpc_error,
)

__all__ = [
    "AsyncClient",
    "Client",
    "FailedPreconditionError",
    "GenerateChunk",
    "GenerateResult",
    "InvalidArgumentError",
    "KvplaneError",
    "NotFoundError",
    "RejectedError",
    "RequestMetrics",
    "RouteResult",
    "UnavailableError",
    "WorkerCache",
    "WorkerStatus",
    "from_rpc_error",
]
