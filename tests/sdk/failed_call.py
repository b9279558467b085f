"""A failed gRPC call as grpc reports it (code(), details(), trailing_metadata()), for tests of the error path."""

from __future__ import annotations

import grpc

from kvplane.errors import REASON_KEY, RETRY_AFTER_MS_KEY


class FailedCall(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple = ()) -> None:
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailers


def rejection(retry_after_ms: int | None, reason: str = "ttft_slo", details: str = "overloaded") -> FailedCall:
    """A RESOURCE_EXHAUSTED answer with the control plane's trailers (no hint when retry_after_ms is None)."""
    trailers: tuple = ((REASON_KEY, reason),)
    if retry_after_ms is not None:
        trailers += ((RETRY_AFTER_MS_KEY, str(retry_after_ms)),)
    return FailedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, details, trailers)
