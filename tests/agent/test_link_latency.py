"""The control-plane link carries the latency model: the stored profile from the registration
seeds the agent's model, and every load report sends the current model and the load detail.
A fake Registry over loopback gRPC plays the control plane."""

from __future__ import annotations

import asyncio
import time

import grpc

from kvplane.dataplane.agent.config import AgentConfig
from kvplane.dataplane.agent.link import KEEPALIVE_RETRY_S, ControlPlaneLink, keepalive_pace, next_keepalive_delay
from kvplane.grpc_util import make_server
from kvplane.latency import OnlineStepModel, StepSample, samples_from_pb, samples_to_pb
from kvplane.security.credentials import Credentials
from kvplane.v1 import common_pb2, registry_pb2, registry_pb2_grpc

from .helpers import wait_until

PROFILE = [StepSample(n, n * n // 2, 0, 0, 1e-3 + 1e-5 * n) for n in range(16, 400, 16)] + [
    StepSample(0, 0, b, 100 * b * (b % 3 + 1), 1e-3 + 5e-5 * b) for b in range(1, 12)
]


class FakeRegistry(registry_pb2_grpc.RegistryServicer):
    def __init__(self, profile: common_pb2.LatencyProfile | None) -> None:
        self.profile = profile
        self.reports: list[registry_pb2.ReportLoadRequest] = []

    async def Register(self, request, context):
        reply = registry_pb2.RegisterResponse(lease_id=7, ttl_seconds=10, session_token=b"s")
        if self.profile is not None:
            reply.profile.CopyFrom(self.profile)
        return reply

    async def KeepAlive(self, request, context):
        return registry_pb2.KeepAliveResponse(ttl_seconds=10)

    async def ReportLoad(self, request, context):
        self.reports.append(request)
        return registry_pb2.ReportLoadResponse()

    async def PublishKVEvents(self, request, context):
        return registry_pb2.PublishKVEventsResponse()

    async def Deregister(self, request, context):
        return registry_pb2.DeregisterResponse()


async def serve_registry(registry: FakeRegistry) -> tuple[grpc.aio.Server, str]:
    """`registry` served over loopback gRPC: (the server, its address)."""
    server = make_server()
    port = server.add_insecure_port("127.0.0.1:0")
    registry_pb2_grpc.add_RegistryServicer_to_server(registry, server)
    await server.start()
    return server, f"127.0.0.1:{port}"


async def run_link(
    profile: common_pb2.LatencyProfile | None, registry: FakeRegistry | None = None, num_reports: int = 3, until=None, what: str = ""
):
    registry = registry or FakeRegistry(profile)
    server, address = await serve_registry(registry)
    online = OnlineStepModel()
    load = common_pb2.WorkerLoad(num_running=2, running_remaining_tokens=[5, 9], running_context_tokens=321)

    def latency():
        model = online.model()
        return model.to_pb() if model is not None else None

    link = ControlPlaneLink(
        AgentConfig(worker_id="w1", controlplane=address, load_report_interval_s=0.05).validate(),
        info=lambda: common_pb2.WorkerInfo(worker_id="w1"),
        load=lambda: (load, common_pb2.WORKER_STATE_ACTIVE),
        take_events=lambda: [],
        snapshot=lambda: [],
        latency=latency,
        on_profile=lambda stored: online.seed(samples_from_pb(stored)),
        credentials=Credentials.plaintext(source="test"),
    )
    try:
        await link.start(timeout_s=5)
        await wait_until(lambda: len(registry.reports) >= num_reports, f"{num_reports} load reports have arrived")
        if until is not None:
            await wait_until(lambda: until(registry), what)
    finally:
        await link.stop()
        await server.stop(0)
    return registry, online


def test_a_stored_profile_seeds_the_model_that_load_reports_carry():
    registry, online = asyncio.run(run_link(samples_to_pb(PROFILE, 1700000000.0)))
    model = online.model()
    assert model is not None and model.seeded_from_profile and model.num_samples == len(PROFILE)
    assert registry.reports, "no load report arrived"
    for report in registry.reports:
        assert report.HasField("latency") and report.latency == model.to_pb()
        assert list(report.load.running_remaining_tokens) == [5, 9] and report.load.running_context_tokens == 321


def test_without_a_profile_or_samples_reports_carry_no_model():
    registry, online = asyncio.run(run_link(None))
    assert online.model() is None
    assert registry.reports and not any(r.HasField("latency") for r in registry.reports)


class StreamingRegistry(FakeRegistry):
    """Takes reports on ReportLoadStream, and ends each stream after `per_stream` of them."""

    def __init__(self, per_stream: int) -> None:
        super().__init__(None)
        self.per_stream = per_stream
        self.num_streams = 0
        self.num_unary = 0

    async def ReportLoad(self, request, context):
        self.num_unary += 1
        return await super().ReportLoad(request, context)

    async def ReportLoadStream(self, request_iterator, context):
        self.num_streams += 1
        taken = 0
        async for request in request_iterator:
            self.reports.append(request)
            yield registry_pb2.ReportLoadResponse()
            taken += 1
            if taken == self.per_stream:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "stream ended by the test")


def test_reports_go_on_one_stream_which_is_opened_again_when_it_ends():
    registry, _ = asyncio.run(run_link(None, StreamingRegistry(per_stream=4), num_reports=10))
    assert registry.num_unary == 0
    assert registry.num_streams >= 3  # 4 reports each, then a fresh stream for the next
    assert len(registry.reports) >= 10


def test_a_control_plane_without_the_report_stream_gets_a_call_per_report():
    registry = FakeRegistry(None)  # no ReportLoadStream: UNIMPLEMENTED
    registry, _ = asyncio.run(run_link(None, registry))
    assert len(registry.reports) >= 3


class KeepAliveCounter(FakeRegistry):
    """Counts keep-alives by the way they came; a short lease (ttl 2: one every 0.67 s)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.num_unary = self.num_streamed = self.num_streams = 0

    async def Register(self, request, context):
        return registry_pb2.RegisterResponse(lease_id=7, ttl_seconds=2, session_token=b"s")

    async def KeepAlive(self, request, context):
        self.num_unary += 1
        return registry_pb2.KeepAliveResponse(ttl_seconds=2)


class StreamingKeepAlives(KeepAliveCounter):
    """Takes keep-alives on KeepAliveStream, and ends each stream after 2 of them."""

    async def KeepAliveStream(self, request_iterator, context):
        self.num_streams += 1
        taken = 0
        async for request in request_iterator:
            assert (request.lease_id, request.session_token) == (7, b"s")
            self.num_streamed += 1
            yield registry_pb2.KeepAliveResponse(ttl_seconds=2)
            taken += 1
            if taken == 2:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "stream ended by the test")


def test_keep_alives_go_on_one_stream_which_is_opened_again_when_it_ends():
    registry, _ = asyncio.run(run_link(None, StreamingKeepAlives(), until=lambda r: r.num_streamed >= 4, what="4 keep-alives"))
    assert registry.num_unary == 0
    assert registry.num_streams >= 2  # 2 keep-alives each, then a fresh stream for the next


def test_a_control_plane_without_the_keep_alive_stream_gets_a_call_per_keep_alive():
    """KeepAliveCounter serves no KeepAliveStream (an older control plane: UNIMPLEMENTED), so the
    agent renews with one KeepAlive call each time; run_link fails unless two of them arrive."""
    registry, _ = asyncio.run(run_link(None, KeepAliveCounter(), until=lambda r: r.num_unary >= 2, what="2 keep-alive calls"))
    assert registry.num_unary >= 2


def test_a_failed_keep_alive_is_tried_again_soon_while_the_lease_may_live():
    """At the pace alone, a keep-alive that times out (a third of the TTL) and the next one (a third
    later) let the lease lapse on one slow answer from a busy replica."""
    ttl = 30.0
    pace = keepalive_pace(ttl)
    assert pace == 10.0

    def delay(failures, since, moved=False):
        return next_keepalive_delay(ttl, failures=failures, first_failure_after_move=moved, since_renewed_s=since)

    assert delay(0, 10.0) == pace
    assert delay(1, 12.0, moved=True) == 0.0  # at once to the replica the link moved to
    # Soon, then backing off (a fleet whose replicas are all down does not come back at them at once).
    assert [delay(n, 12.0) for n in (1, 2, 3, 4, 5, 6)] == [KEEPALIVE_RETRY_S, 1.0, 2.0, 4.0, 8.0, pace]
    assert delay(1, 31.0) == pace  # lapsed by now: no faster than the pace
    assert next_keepalive_delay(1.0, failures=1, first_failure_after_move=False, since_renewed_s=0.2) == keepalive_pace(1.0) == 0.5


class FailsFirstKeepAlive(KeepAliveCounter):
    """A lease of 9 s (keep-alives every 3 s) whose first keep-alive is answered UNAVAILABLE (a
    replica that had no time for it); notes when each keep-alive came."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[float] = []

    async def Register(self, request, context):
        return registry_pb2.RegisterResponse(lease_id=7, ttl_seconds=9, session_token=b"s")

    async def KeepAlive(self, request, context):
        self.arrivals.append(time.monotonic())
        self.num_unary += 1
        if self.num_unary == 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
        return registry_pb2.KeepAliveResponse(ttl_seconds=9)


def test_the_link_tries_a_failed_keep_alive_again_before_its_pace():
    registry, _ = asyncio.run(run_link(None, FailsFirstKeepAlive(), until=lambda r: r.num_unary >= 2, what="2 keep-alive calls"))
    first, second = registry.arrivals[:2]
    assert second - first < keepalive_pace(9)  # retried after KEEPALIVE_RETRY_S, not a whole pace (3 s) later
