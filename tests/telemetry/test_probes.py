"""/healthz and /readyz on the metrics port (kvplane/telemetry/probes.py), over real HTTP and beside a
real gRPC health service: /readyz says what grpc.health.v1 says (503 before serving and while
draining), /healthz fails only when the event loop stalls, and /metrics is still served."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvplane import grpc_util
from kvplane.grpc_util import add_port, enable_health_and_reflection, make_server, set_serving
from kvplane.security.credentials import Credentials
from kvplane.telemetry import probes

SERVICES = ("kvplane.v1.Agent",)


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_readyz_follows_grpc_health_and_metrics_are_still_served(monkeypatch):
    state = probes.Probes()
    monkeypatch.setattr(grpc_util, "probes", state)  # this test's servers report here, not to the process's
    http = probes.start_http_server(0, "127.0.0.1", state)
    port = http.server_port
    try:
        assert _get(port, "/readyz") == (503, "starting\n")
        assert _get(port, "/healthz") == (200, "alive\n")
        status, body = _get(port, "/metrics")
        assert status == 200 and "# HELP" in body

        async def scenario() -> list[tuple]:
            server = make_server()
            health = enable_health_and_reflection(server, SERVICES)
            grpc_port = add_port(server, "127.0.0.1:0", Credentials.plaintext())
            await server.start()
            seen = []
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                    stub = health_pb2_grpc.HealthStub(channel)
                    for serving in (True, False):
                        await set_serving(health, SERVICES, serving)
                        reply = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICES[0]), timeout=5)
                        seen.append((reply.status, await asyncio.to_thread(_get, port, "/readyz")))
            finally:
                await server.stop(None)
            return seen

        assert asyncio.run(scenario()) == [
            (health_pb2.HealthCheckResponse.SERVING, (200, "ready\n")),
            (health_pb2.HealthCheckResponse.NOT_SERVING, (503, "not serving\n")),  # a draining agent
        ]
    finally:
        http.shutdown()


def test_healthz_fails_when_the_event_loop_stops_beating_and_readiness_needs_every_server():
    clock = [100.0]
    state = probes.Probes(clock=lambda: clock[0])
    assert state.liveness() == (True, "alive")  # before the first server: the startup probe's business

    async def serve_then_stall() -> None:
        state.set_serving("a", True)
        state.set_serving("b", False)
        assert state.readiness() == (False, "not serving")
        state.set_serving("b", True)
        assert state.readiness() == (True, "ready")
        await asyncio.sleep(0)  # one heartbeat
        clock[0] += probes.STALL_S - 1
        assert state.liveness() == (True, "alive")

    asyncio.run(serve_then_stall())  # the loop ends: no more beats
    clock[0] += 2
    ok, word = state.liveness()
    assert not ok and word.startswith("event loop stalled for 31")
