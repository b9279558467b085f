"""Errors the kvplane SDK raises, one class per gRPC status a caller may want to handle.

The control plane rejects a request it cannot serve within its objective with
RESOURCE_EXHAUSTED and two trailing metadata entries (keys below), so that a client can
back off by the amount the server predicted instead of guessing. Servers import the key
names and `rejection_trailers` from here so both sides spell them the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import grpc

# Trailing metadata keys of a rejection (gRPC metadata keys must be lowercase ASCII).
RETRY_AFTER_MS_KEY = "retry-after-ms"  # decimal milliseconds, e.g. "1500"
REASON_KEY = "kvplane-reason"  # short machine-readable reason, e.g. "ttft_slo"
# Other refusals may name their kind in this trailer, for callers that map statuses further
# (the HTTP face answers 404 for an unknown model, as OpenAI does).
ERROR_KIND_KEY = "kvplane-error"
UNKNOWN_MODEL = "unknown-model"


class KvplaneError(Exception):
    """A call to a kvplane server failed; `.code` is the gRPC status, `.details` its message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details

    def __str__(self) -> str:
        return self.details or f"kvplane call failed with status {self.code.name}"


class RejectedError(KvplaneError):
    """Admission control refused the request (RESOURCE_EXHAUSTED); retry after `.retry_after_s`."""

    def __init__(
        self,
        details: str,
        *,
        retry_after_s: float | None = None,
        reason: str = "",
        code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED,
    ) -> None:
        super().__init__(code, details)
        self.retry_after_s = retry_after_s
        self.reason = reason

    def __str__(self) -> str:
        message = f"request rejected: {self.details or 'the cluster is overloaded'}"
        if self.reason:
            message += f" [{self.reason}]"
        if self.retry_after_s is not None:
            message += f"; retry after {self.retry_after_s:g} s"
        return message


class InvalidArgumentError(KvplaneError):
    """The server found the request malformed (INVALID_ARGUMENT); fix the request, do not retry."""


class FailedPreconditionError(KvplaneError):
    """The cluster is not in a state to serve this (FAILED_PRECONDITION), e.g. no workers of a role."""


class UnavailableError(KvplaneError):
    """The server could not be reached or did not answer in time (UNAVAILABLE, DEADLINE_EXCEEDED)."""


class NotFoundError(KvplaneError):
    """The named object (for example a worker id) does not exist (NOT_FOUND)."""


class UnauthenticatedError(KvplaneError):
    """The server does not know who is calling (UNAUTHENTICATED): give credentials (docs/security.md)."""


class PermissionDeniedError(KvplaneError):
    """The caller's identity may not do this (PERMISSION_DENIED), e.g. an admin call from a client."""


_CLASS_BY_CODE: dict[grpc.StatusCode, type[KvplaneError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UnavailableError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}


def from_rpc_error(e: grpc.RpcError, *, endpoint: str | None = None, credentials: str = "") -> KvplaneError:
    """The KvplaneError subclass for a failed call; `endpoint` and `credentials` (what the client
    presented, in words) only make messages actionable."""
    code = _call_attr(e, "code", grpc.StatusCode.UNKNOWN)
    details = _call_attr(e, "details", "") or ""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        trailers = _metadata_dict(_call_attr(e, "trailing_metadata", None))
        return RejectedError(
            details,
            retry_after_s=_parse_retry_after(trailers.get(RETRY_AFTER_MS_KEY)),
            reason=trailers.get(REASON_KEY, ""),
        )
    if code == grpc.StatusCode.UNAVAILABLE and endpoint and _is_connection_failure(details):
        details = (
            f"cannot reach the kvplane control plane at {endpoint} ({details or 'unavailable'}); "
            "is it running? Set --endpoint or KVPLANE_ENDPOINT to point elsewhere"
        )
        if credentials:
            details += (
                f"; the client used {credentials}: a TLS handshake failure looks the same, so check that the "
                "server expects these (--tls-ca/--tls-cert/--tls-key, --insecure; docs/security.md)"
            )
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        details = f"no answer within the deadline ({details or 'deadline exceeded'})"
    return _CLASS_BY_CODE.get(code, KvplaneError)(code, details)


def rejection_trailers(retry_after_s: float | None, reason: str) -> tuple[tuple[str, str], ...]:
    """Trailing metadata a server attaches to a RESOURCE_EXHAUSTED rejection."""
    trailers: list[tuple[str, str]] = [(REASON_KEY, reason)]
    if retry_after_s is not None:
        trailers.append((RETRY_AFTER_MS_KEY, str(max(0, math.ceil(retry_after_s * 1000)))))
    return tuple(trailers)


def _is_connection_failure(details: str) -> bool:
    """True when gRPC itself could not reach the server (not a server-sent UNAVAILABLE)."""
    lowered = details.lower()
    return not details or any(
        w in lowered for w in ("failed to connect", "connection refused", "dns resolution", "socket closed", "connection reset")
    )


def _call_attr(e: grpc.RpcError, name: str, default: Any) -> Any:
    # A bare grpc.RpcError (or one raised before the call started) may lack these methods.
    method = getattr(e, name, None)
    if method is None:
        return default
    try:
        value = method()
    except Exception:  # noqa: BLE001 - a broken error object must not hide the original failure
        return default
    return default if value is None else value


def _metadata_dict(metadata: Iterable[Any] | None) -> dict[str, str]:
    # Sync calls give a tuple of _Metadatum, aio calls a grpc.aio.Metadata; both iterate as pairs.
    result: dict[str, str] = {}
    for key, value in metadata or ():
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        result[key.lower()] = value
    return result


def _parse_retry_after(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        millis = float(raw.strip())
    except ValueError:
        return None  # a malformed hint is no hint; the rejection itself still stands
    if not math.isfinite(millis) or millis < 0:
        return None
    return millis / 1000.0
