"""The shared call path without a server: one builder per RPC, the deadline and retry rule, the Generate span."""

from __future__ import annotations

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import kvplane
from kvplane.client import calls, from_proto
from kvplane.client.request import RequestOptions
from kvplane.v1 import client_pb2, common_pb2
from tests.sdk.failed_call import FailedCall, rejection

KVPLANE = client_pb2.DESCRIPTOR.services_by_name["Kvplane"]
REQUEST = RequestOptions(max_tokens=3).to_proto("hi")
UNARY_CALLS = {
    "route": calls.route(REQUEST, 2),
    "report": calls.report(client_pb2.ReportRequest(placement_id="p", event=client_pb2.ReportRequest.FINISHED)),
    "workers": calls.workers(),
    "cache": calls.cache(),
    "stats": calls.stats(30.0),
    "drain": calls.drain("decode-0"),
    "undrain": calls.undrain("decode-0"),
    "config": calls.config(),
    "set_config": calls.set_config("admission.policy", "none"),
    "profile": calls.profile("prefill-0", 512, 8),
}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- one builder per RPC --------------------------------------------------------------------------


def test_every_rpc_of_the_service_has_exactly_one_builder() -> None:
    unary = {m.name: m for m in KVPLANE.methods if not m.server_streaming and not m.client_streaming}
    assert sorted(call.method for call in UNARY_CALLS.values()) == sorted(unary)
    # Route has a second builder, for lookaside placements (same method and message, another reader).
    place = calls.place(REQUEST, 1)
    assert (place.method, place.request.DESCRIPTOR) == ("Route", unary["Route"].input_type)
    for call in UNARY_CALLS.values():  # each builder sends the message type its method takes
        assert call.request.DESCRIPTOR is unary[call.method].input_type
    # Generate streams answers; ReportStream carries Report's messages (the asyncio client's lookaside reports).
    assert [m.name for m in KVPLANE.methods if m.server_streaming] == ["Generate", "ReportStream"]
    [report_stream] = [m for m in KVPLANE.methods if m.client_streaming]
    assert report_stream.name == "ReportStream" and report_stream.input_type is unary["Report"].input_type
    assert calls.generate(REQUEST, 1) == calls.GenerateCall(REQUEST, 1)


def test_builders_carry_their_arguments_and_converters() -> None:
    c = UNARY_CALLS
    assert (c["route"].request, c["route"].result, c["route"].reject_retries) == (REQUEST, from_proto.route_from_proto, 2)
    assert c["stats"].request == client_pb2.GetStatsRequest(window_s=30.0)
    assert c["drain"].request == client_pb2.DrainWorkerRequest(worker_id="decode-0")
    assert (c["undrain"].method, c["undrain"].request) == ("UndrainWorker", client_pb2.DrainWorkerRequest(worker_id="decode-0"))
    assert c["set_config"].request == client_pb2.SetConfigRequest(key="admission.policy", value="none")
    assert c["profile"].request == client_pb2.ProfileWorkerRequest(worker_id="prefill-0", max_prompt_tokens=512, max_batch=8)
    # Only a request with a prompt may be rejected by admission, so only route retries.
    assert [name for name, call in c.items() if call.reject_retries] == ["route"]
    answer = client_pb2.ListWorkersResponse(workers=[client_pb2.WorkerStatus(info=common_pb2.WorkerInfo(worker_id="w"))])
    assert [w.worker_id for w in c["workers"].result(answer)] == ["w"]
    with pytest.raises(ValueError, match="max_batch must be between 0 and"):
        calls.profile("w", 0, -1)  # refused while building, before any channel is touched


# -- the deadline and retry rule ------------------------------------------------------------------


def test_the_timeout_covers_every_attempt() -> None:
    clock = Clock()
    attempts = calls.Attempts("cp:1", 2.0, 0, clock=clock)
    assert attempts.timeout() == 2.0
    clock.now += 0.5
    assert attempts.timeout() == 1.5
    clock.now += 5.0
    assert attempts.timeout() == 0.0  # spent: the next attempt fails at once with DEADLINE_EXCEEDED
    assert calls.Attempts("cp:1", None, 3, clock=clock).timeout() is None


def test_a_rejection_is_retried_after_its_hint_until_the_retries_run_out() -> None:
    attempts = calls.Attempts("cp:1", None, 2)
    failure = rejection(250)
    assert attempts.wait_after(failure) == 0.25
    assert attempts.wait_after(failure) == 0.25
    assert attempts.num_retries == 2
    with pytest.raises(kvplane.RejectedError) as info:
        attempts.wait_after(failure)
    assert (info.value.retry_after_s, info.value.reason, info.value.__cause__) == (0.25, "ttft_slo", failure)
    assert attempts.num_retries == 2


def test_a_hint_that_does_not_fit_in_the_time_left_ends_the_call() -> None:
    clock = Clock()
    attempts = calls.Attempts("cp:1", 1.0, 5, clock=clock)
    assert attempts.wait_after(rejection(400)) == 0.4
    clock.now += 0.7  # 0.3 s left < the 0.4 s hint
    with pytest.raises(kvplane.RejectedError):
        attempts.wait_after(rejection(400))
    assert attempts.num_retries == 1


@pytest.mark.parametrize(
    ("failure", "received", "cls"),
    [
        (rejection(None), False, kvplane.RejectedError),  # no hint: nothing to wait for
        (rejection(10), True, kvplane.RejectedError),  # tokens already reached the caller
        (FailedCall(grpc.StatusCode.UNAVAILABLE, "no healthy upstream"), False, kvplane.UnavailableError),  # not a connection failure
        (FailedCall(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens must be > 0"), False, kvplane.InvalidArgumentError),
    ],
    ids=["rejection-without-hint", "after-first-message", "unavailable", "invalid-argument"],
)
def test_what_is_never_retried(failure: grpc.RpcError, received: bool, cls: type) -> None:
    attempts = calls.Attempts("cp:7", None, 5)
    with pytest.raises(cls) as info:
        attempts.wait_after(failure, received=received)
    assert type(info.value) is cls and info.value.__cause__ is failure
    assert attempts.num_retries == 0


def test_connection_errors_name_the_endpoint() -> None:
    no_window = calls.Backoff(window_s=0.0)
    with pytest.raises(kvplane.UnavailableError, match=r"^cannot reach the kvplane control plane at cp:7 \(connection refused\)"):
        calls.Attempts("cp:7", None, 0, backoff=no_window).wait_after(FailedCall(grpc.StatusCode.UNAVAILABLE, "connection refused"))


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_unreachable_control_plane_is_retried_with_growing_jittered_waits_until_the_window_ends() -> None:
    clock = ManualClock()
    refused = FailedCall(grpc.StatusCode.UNAVAILABLE, "connection refused")
    backoff = calls.Backoff(initial_s=0.1, max_s=1.0, multiplier=2.0, window_s=5.0)
    waits = []
    for rand in (0.0, 1.0):  # the jitter's two ends
        attempts = calls.Attempts("cp:7", None, 0, clock=clock, backoff=backoff, rand=lambda rand=rand: rand)
        clock.now = 0.0
        tried = []
        with pytest.raises(kvplane.UnavailableError, match="cannot reach"):
            while True:
                tried.append(attempts.wait_after(refused))
                clock.now += tried[-1]
        waits.append(tried)
    assert waits[0][:5] == [0.05, 0.1, 0.2, 0.4, 0.5] and waits[1][:5] == [0.1, 0.2, 0.4, 0.8, 1.0]
    assert all(sum(w) <= backoff.window_s for w in waits) and max(waits[1]) == backoff.max_s
    # The call's own timeout bounds it too: no wait that would outlast it.
    attempts = calls.Attempts("cp:7", 0.12, 0, clock=ManualClock(), backoff=backoff, rand=lambda: 1.0)
    assert attempts.wait_after(refused) == 0.1
    with pytest.raises(kvplane.UnavailableError):
        attempts.wait_after(refused)


# -- one Generate call, its retries and its span --------------------------------------------------


def _tracer() -> tuple[InMemorySpanExporter, object]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider.get_tracer("test")


def test_a_generate_call_has_one_span_over_its_retries() -> None:
    exporter, tracer = _tracer()
    call = calls.generate(REQUEST, 1)
    progress = calls.GenerateProgress(call, calls.Attempts("127.0.0.1:5005", None, call.reject_retries), tracer)
    assert [key for key, _ in progress.metadata] == ["traceparent"]
    assert progress.wait_after(rejection(20)) == 0.02  # the first attempt was rejected
    first = progress.chunk(client_pb2.GenerateResponse(token_ids=[5, 6], text="ab", request_id="r"))
    last = progress.chunk(client_pb2.GenerateResponse(finished=True, finish_reason="length", request_id="r",
                                                      metrics=common_pb2.RequestMetrics(prompt_tokens=2, ttft_ms=4.0)))  # fmt: skip
    assert (first.token_ids, first.metrics, last.finished, last.metrics.request_id) == ((5, 6), None, True, "r")
    progress.end()
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.UNSET
    attributes = dict(span.attributes)
    assert (attributes["server.address"], attributes["server.port"], attributes["rpc.grpc.status_code"]) == ("127.0.0.1", 5005, 0)
    assert (attributes["gen_ai.usage.output_tokens"], attributes["gen_ai.usage.input_tokens"], attributes["kvplane.request_id"]) == (
        2,
        2,
        "r",
    )


def test_a_stream_that_failed_after_its_first_message_is_not_retried_and_its_span_says_so() -> None:
    exporter, tracer = _tracer()
    call = calls.generate(REQUEST, 3)
    progress = calls.GenerateProgress(call, calls.Attempts("cp:1", None, call.reject_retries), tracer)
    progress.chunk(client_pb2.GenerateResponse(token_ids=[1], text="a"))
    with pytest.raises(kvplane.RejectedError):
        progress.wait_after(rejection(10))
    progress.end()
    (span,) = exporter.get_finished_spans()
    assert (span.status.status_code, span.status.description) == (StatusCode.ERROR, "RESOURCE_EXHAUSTED")
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert span.attributes["gen_ai.usage.output_tokens"] == 1


# -- several control-plane replicas -----------------------------------------------------------------


def test_endpoint_lists_are_split_and_checked() -> None:
    assert calls.split_endpoints("a:1, b:2") == ("a:1", "b:2")
    assert calls.split_endpoints(["a:1"]) == ("a:1",)
    with pytest.raises(ValueError, match="comma-separated list"):
        calls.split_endpoints("a:1,,b:2")


def test_an_unreachable_replica_fails_over_to_the_next_once_each_then_backs_off() -> None:
    lost = FailedCall(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    attempts = calls.Attempts("a:1,b:2,c:3", None, 0, first=1, backoff=calls.Backoff(initial_s=0.1, window_s=0.15), rand=lambda: 1.0)
    assert attempts.endpoint == "b:2"
    assert attempts.wait_after(lost) == 0.0 and attempts.endpoint == "c:3"
    assert attempts.wait_after(lost) == 0.0 and attempts.endpoint == "a:1"
    assert attempts.wait_after(lost) == 0.1 and attempts.endpoint == "b:2"  # all down: wait, then round again
    with pytest.raises(kvplane.UnavailableError, match=r"cannot reach the kvplane control plane at any of a:1, b:2, c:3"):
        attempts.wait_after(lost)


def test_an_answer_from_a_replica_is_not_failed_over() -> None:
    """UNAVAILABLE sent by the replica about a worker: the replica works, another would say the same."""
    from kvplane.errors import component_trailers

    attempts = calls.Attempts("a:1,b:2", None, 0)
    relayed = FailedCall(grpc.StatusCode.UNAVAILABLE, "decode worker w failed (Socket closed)", component_trailers("worker w"))
    with pytest.raises(kvplane.UnavailableError, match="decode worker w failed"):
        attempts.wait_after(relayed)
    assert attempts.endpoint == "a:1"


def test_a_stream_whose_replica_died_resumes_on_the_next_after_the_tokens_received() -> None:
    exporter, tracer = _tracer()
    call = calls.generate(REQUEST, 0)
    progress = calls.GenerateProgress(call, calls.Attempts("a:1,b:2", None, 0, rand=lambda: 1.0), tracer, max_resumes=2)
    assert progress.request() is call.request
    progress.chunk(client_pb2.GenerateResponse(token_ids=[5, 6], text="ab"))
    lost = FailedCall(grpc.StatusCode.UNAVAILABLE, "Socket closed")
    assert progress.wait_after(lost) == 0.1 and progress.attempts.endpoint == "b:2"  # backed off, not at once
    resumed = progress.request()
    assert list(resumed.resume_token_ids) == [5, 6] and resumed.sampling == call.request.sampling
    # The resume cannot connect either (the replicas restart): the same outage, a longer wait.
    assert progress.wait_after(FailedCall(grpc.StatusCode.UNAVAILABLE, "connection refused")) == 0.2
    progress.chunk(client_pb2.GenerateResponse(token_ids=[7], text="c"))
    assert list(progress.request().resume_token_ids) == [5, 6, 7]
    assert progress.wait_after(lost) == 0.1  # a new outage starts from the first wait
    progress.chunk(client_pb2.GenerateResponse(token_ids=[8], text="d"))
    with pytest.raises(kvplane.UnavailableError):
        progress.wait_after(lost)  # resumed twice: the limit
    progress.end()
    (span,) = exporter.get_finished_spans()
    assert span.attributes["gen_ai.usage.output_tokens"] == 4
