"""kvplane: control plane and data plane for prefill/decode disaggregated LLM serving.

The client SDK is importable from here: `kvplane.Client`, `kvplane.AsyncClient` and the errors.
They load on first access (PEP 562), so that `import kvplane.types` from the plain-Python
routing core does not pull in grpc.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AsyncClient": "kvplane.client",
    "Client": "kvplane.client",
    "GenerateChunk": "kvplane.client",
    "GenerateResult": "kvplane.client",
    "RequestMetrics": "kvplane.client",
    "RequestOptions": "kvplane.client",
    "RouteResult": "kvplane.client",
    "WorkerCache": "kvplane.client",
    "WorkerStatus": "kvplane.client",
    "Credentials": "kvplane.security",
    "FailedPreconditionError": "kvplane.errors",
    "InvalidArgumentError": "kvplane.errors",
    "KvplaneError": "kvplane.errors",
    "NotFoundError": "kvplane.errors",
    "PermissionDeniedError": "kvplane.errors",
    "RejectedError": "kvplane.errors",
    "UnauthenticatedError": "kvplane.errors",
    "UnavailableError": "kvplane.errors",
    "from_rpc_error": "kvplane.errors",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from kvplane.client import (
        AsyncClient,
        Client,
        GenerateChunk,
        GenerateResult,
        RequestMetrics,
        RequestOptions,
        RouteResult,
        WorkerCache,
        WorkerStatus,
    )
    from kvplane.errors import (
        FailedPreconditionError,
        InvalidArgumentError,
        KvplaneError,
        NotFoundError,
        PermissionDeniedError,
        RejectedError,
        UnauthenticatedError,
        UnavailableError,
        from_rpc_error,
    )
    from kvplane.security import Credentials


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvplane' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
