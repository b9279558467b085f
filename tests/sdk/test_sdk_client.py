"""kvplane.Client against a real gRPC server speaking the Kvplane protocol."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

import kvplane
from kvplane import Client
from kvplane.client import DEFAULT_ENDPOINT, WorkerState, resolve_endpoint
from kvplane.types import KVLayout, Role
from tests.sdk.scripted_server import ScriptedServer


def test_generate_assembles_the_stream(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client:
        result = client.generate("hello", max_tokens=4, cache_salt="t1")
    assert result.token_ids == tuple(map(ord, "hell"))
    assert result.text == "hell"
    assert result.finish_reason == "length"
    assert result.request_id == "req-1"
    assert result.metrics == kvplane.RequestMetrics(
        prefill_worker="prefill-0", decode_worker="decode-0", prompt_tokens=5, cached_tokens=2,
        kv_transfer_bytes=4096, kv_transfer_blocks=1, transport="grpc", ttft_ms=12.5, disaggregated=True,
        route_reason="remote prefill: 3 uncached tokens >= threshold", prefill_computed_tokens=3,
        kv_transfer_ms=0.75, request_id="req-1", predicted_ttft_ms=11.0, predicted_tpot_ms=2.5,
        priority="interactive", queued_ms=0.0,
    )  # fmt: skip
    assert server.servicer.requests[-1].cache_salt == "t1"


def test_stream_yields_chunks_then_a_final_one_with_metrics(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client:
        chunks = list(client.stream([104, 105, 106], max_tokens=3))
    assert [c.token_ids for c in chunks] == [(104, 105), (106,), ()]
    assert [c.text for c in chunks] == ["hi", "j", ""]
    assert [c.finished for c in chunks] == [False, False, True]
    assert chunks[0].metrics is None
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].metrics is not None and chunks[-1].metrics.kv_transfer_bytes == 4096


def test_stream_checks_arguments_before_iteration(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client, pytest.raises(ValueError, match="disagg must be one of"):
        client.stream("x", disagg="maybe")
    assert server.servicer.requests == []  # nothing was sent


def test_leaving_a_stream_early_cancels_the_request(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client:
        stream = client.stream("long")
        assert next(stream).text == "x"
        stream.close()  # what `break` out of a for loop does once the generator is collected
    assert server.servicer.cancelled.wait(timeout=5)


def test_rejection_carries_retry_after_and_reason(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client, pytest.raises(kvplane.RejectedError) as info:
        client.generate("reject")
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.retry_after_s == 1.5
    assert info.value.reason == "ttft_slo"
    assert info.value.details == "no decode worker can meet the TTFT objective"


def test_rejection_without_hint(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client, pytest.raises(kvplane.RejectedError) as info:
        client.route("reject-no-hint")
    assert (info.value.retry_after_s, info.value.reason) == (None, "")


@pytest.mark.parametrize(
    ("prompt", "cls"),
    [
        ("invalid", kvplane.InvalidArgumentError),
        ("precondition", kvplane.FailedPreconditionError),
        ("unavailable", kvplane.UnavailableError),
        ("midstream-error", kvplane.UnavailableError),
        ("internal", kvplane.KvplaneError),
    ],
)
def test_server_errors_map_to_sdk_errors(server: ScriptedServer, prompt: str, cls: type) -> None:
    with Client(server.endpoint) as client, pytest.raises(cls) as info:
        client.generate(prompt)
    assert type(info.value) is cls


def test_deadline_is_unavailable(server: ScriptedServer) -> None:
    with Client(server.endpoint, timeout=0.3) as client, pytest.raises(kvplane.UnavailableError) as info:
        client.generate("slow")
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_stream_that_ends_unfinished_is_an_error(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client, pytest.raises(kvplane.KvplaneError, match="ended before the request finished"):
        client.generate("truncated")


def test_unreachable_server_names_the_endpoint() -> None:
    with Client("127.0.0.1:1", timeout=5) as client, pytest.raises(kvplane.UnavailableError, match="127.0.0.1:1"):
        client.workers()


def test_route(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client:
        decision = client.route("some prompt", disagg="never")
    assert (decision.decode_worker, decision.prefill_worker, decision.disaggregated) == ("decode-0", "prefill-0", True)
    assert (decision.prompt_tokens, decision.cached_tokens, decision.reason) == (40, 16, "long uncached prompt")
    assert [dataclasses.astuple(c) for c in decision.candidates] == [("decode-0", 1.5, 16, True, "best")]


def test_workers(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client:
        prefill, decode = client.workers()
    assert (prefill.worker_id, prefill.role, prefill.state, prefill.endpoint) == (
        "prefill-0",
        Role.PREFILL,
        WorkerState.ACTIVE,
        "127.0.0.1:7001",
    )
    assert prefill.layout == KVLayout("builtin-tiny", 2, 2, 16, "float32", 16)
    assert (prefill.load.num_running, prefill.load.num_waiting, prefill.load.num_total_blocks) == (1, 2, 512)
    assert prefill.transports == ("grpc",) and prefill.load_age_s == 0.25
    assert (decode.role, decode.state, decode.layout) == (Role.DECODE, WorkerState.DRAINING, None)
    assert (prefill.out_of_routing, decode.out_of_routing) == ("", "stalled a request 3.0 s ago")


def test_cache_and_drain(server: ScriptedServer) -> None:
    with Client(server.endpoint) as client:
        assert [(c.worker_id, c.blocks_by_tier) for c in client.cache()] == [("decode-0", {"device": 7, "host": 3})]
        drained = client.drain("decode-0")
        assert (drained.worker_id, drained.state) == ("decode-0", WorkerState.DRAINING)
        with pytest.raises(kvplane.NotFoundError, match="no worker 'nope'"):
            client.drain("nope")


def test_endpoint_comes_from_argument_then_env_then_default(monkeypatch: pytest.MonkeyPatch, server: ScriptedServer) -> None:
    monkeypatch.delenv("KVPLANE_ENDPOINT", raising=False)
    assert resolve_endpoint() == DEFAULT_ENDPOINT == "127.0.0.1:50051"
    monkeypatch.setenv("KVPLANE_ENDPOINT", server.endpoint)
    with Client() as client:
        assert client.endpoint == server.endpoint
        assert len(client.workers()) == 2  # it really talks to the env endpoint
    assert Client("10.1.1.1:5").endpoint == "10.1.1.1:5"


def test_every_name_the_package_exports_resolves() -> None:
    import kvplane.client
    import kvplane.errors
    import kvplane.security

    for name in kvplane.__all__:
        home = next(m for m in (kvplane.client, kvplane.security, kvplane.errors) if m is kvplane.errors or name in m.__all__)
        assert getattr(kvplane, name) is getattr(home, name), name
    assert all(hasattr(kvplane.client, name) for name in kvplane.client.__all__)


def test_a_replica_lost_after_the_final_message_is_no_reason_to_resume(server: ScriptedServer) -> None:
    """The answer is whole once the final message came; resuming it on another replica got a second
    end and failed with "tokens after the final message" (the HA test saw it under a replica kill)."""
    before = len(server.servicer.requests)
    with Client(server.endpoint) as client:
        result = client.generate("lost-after-the-end")
    assert result.token_ids == (1, 2, 3) and result.text == "abc" and result.finish_reason == "length"
    assert len(server.servicer.requests) == before + 1  # never resumed
