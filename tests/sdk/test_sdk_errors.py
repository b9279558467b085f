"""kvplane.errors: status code -> class mapping and the rejection trailers, round-tripped."""

from __future__ import annotations

import grpc
import pytest

from kvplane.errors import (
    REASON_KEY,
    RETRY_AFTER_MS_KEY,
    FailedPreconditionError,
    InvalidArgumentError,
    KvplaneError,
    NotFoundError,
    RejectedError,
    UnavailableError,
    from_rpc_error,
    rejection_trailers,
)
from tests.sdk.failed_call import FailedCall


def test_metadata_keys_are_the_documented_names() -> None:
    assert RETRY_AFTER_MS_KEY == "retry-after-ms"
    assert REASON_KEY == "kvplane-reason"


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgumentError),
        (grpc.StatusCode.FAILED_PRECONDITION, FailedPreconditionError),
        (grpc.StatusCode.UNAVAILABLE, UnavailableError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, UnavailableError),
        (grpc.StatusCode.NOT_FOUND, NotFoundError),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, RejectedError),
        (grpc.StatusCode.INTERNAL, KvplaneError),
    ],
)
def test_each_status_maps_to_its_class(code: grpc.StatusCode, cls: type[KvplaneError]) -> None:
    error = from_rpc_error(FailedCall(code, "boom"))
    assert type(error) is cls
    assert error.code == code
    assert "boom" in error.details


def test_rejection_reads_retry_after_and_reason_from_trailers() -> None:
    error = from_rpc_error(
        FailedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, "too busy", ((RETRY_AFTER_MS_KEY, "250"), (REASON_KEY, "tbt_slo")))
    )
    assert isinstance(error, RejectedError)
    assert error.retry_after_s == 0.25
    assert error.reason == "tbt_slo"
    assert str(error) == "request rejected: too busy [tbt_slo]; retry after 0.25 s"


@pytest.mark.parametrize("raw", ["soon", "-5", "nan", ""])
def test_malformed_retry_after_is_no_hint(raw: str) -> None:
    error = from_rpc_error(FailedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", ((RETRY_AFTER_MS_KEY, raw),)))
    assert isinstance(error, RejectedError)
    assert error.retry_after_s is None
    assert error.reason == ""


def test_rejection_trailers_round_trip_through_from_rpc_error() -> None:
    trailers = rejection_trailers(1.2341, "queue_full")
    assert dict(trailers) == {REASON_KEY: "queue_full", RETRY_AFTER_MS_KEY: "1235"}  # rounded up, never early
    error = from_rpc_error(FailedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", trailers))
    assert isinstance(error, RejectedError)
    assert (error.retry_after_s, error.reason) == (1.235, "queue_full")
    assert dict(rejection_trailers(None, "x")) == {REASON_KEY: "x"}


def test_unavailable_message_names_the_endpoint_and_the_fix() -> None:
    error = from_rpc_error(FailedCall(grpc.StatusCode.UNAVAILABLE, "connection refused"), endpoint="10.0.0.1:1")
    assert "10.0.0.1:1" in str(error) and "KVPLANE_ENDPOINT" in str(error) and "connection refused" in str(error)


def test_bare_rpc_error_becomes_unknown() -> None:
    error = from_rpc_error(grpc.RpcError())
    assert type(error) is KvplaneError
    assert error.code == grpc.StatusCode.UNKNOWN
    assert str(error) == "kvplane call failed with status UNKNOWN"


def test_server_sent_unavailable_keeps_the_servers_message() -> None:
    # The control plane answered: its reason must reach the caller, not "cannot reach".
    error = from_rpc_error(FailedCall(grpc.StatusCode.UNAVAILABLE, "all 1 decode workers are draining"), endpoint="cp:1")
    assert isinstance(error, UnavailableError)
    assert error.details == "all 1 decode workers are draining"


def test_a_worker_failure_relayed_by_the_control_plane_does_not_blame_it() -> None:
    """The control plane answered about a worker whose connection broke: its message carries
    the worker's transport words ("Socket closed"), and the component trailer says who failed."""
    from kvplane.errors import component_trailers, is_connection_failure

    details = "decode worker decode-0 failed after 5 tokens (UNAVAILABLE: Socket closed); retry the request"
    relayed = FailedCall(grpc.StatusCode.UNAVAILABLE, details, component_trailers("worker decode-0"))
    error = from_rpc_error(relayed, endpoint="cp:1")
    assert isinstance(error, UnavailableError) and error.details == details
    assert not is_connection_failure(relayed)
    lost = FailedCall(grpc.StatusCode.UNAVAILABLE, "Socket closed")
    assert is_connection_failure(lost) and "cannot reach the kvplane control plane at cp:1" in str(from_rpc_error(lost, endpoint="cp:1"))
    assert not is_connection_failure(FailedCall(grpc.StatusCode.INTERNAL, "Socket closed"))
