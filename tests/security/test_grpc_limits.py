"""Issue 28, items 6 and 8, against real gRPC servers made by kvplane.grpc_util: connections that
never finish their handshake, or sit idle after it, are closed within the configured timeouts;
connections beyond the cap are closed at once; a second server cannot bind a port in use
(SO_REUSEPORT off). The attack held 4,000 such connections for ever; a few hundred show it."""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvplane.grpc_util import add_port, aio_channel, make_server
from kvplane.security import certs
from kvplane.security.credentials import Credentials
from kvplane.security.identity import Identity, Role
from kvplane.security.limits import ConnectionLimits

NUM_CONNECTIONS = 300
SHORT = ConnectionLimits(handshake_timeout_s=1.0, idle_timeout_s=1.5)
SLACK_S = 10.0  # how long past its timeout the test waits for a close before it calls it held
# The client's half of an HTTP/2 connection: its preface and an empty SETTINGS frame; then silence.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


@contextlib.asynccontextmanager
async def serving(credentials: Credentials, limits: ConnectionLimits) -> AsyncIterator[int]:
    server = make_server(connections=limits)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = add_port(server, "127.0.0.1:0", credentials)
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


def wait_closed(socks: list[socket.socket], within_s: float, started: float) -> list[float]:
    """Seconds from `started` (when they were opened) until the server closed each socket (EOF or
    reset); inf for those still open `within_s` after `started`."""
    closed = dict.fromkeys(socks, float("inf"))
    with selectors.DefaultSelector() as selector:
        for s in socks:
            s.setblocking(False)
            selector.register(s, selectors.EVENT_READ)
        while selector.get_map() and time.monotonic() - started < within_s:
            for key, _ in selector.select(0.2):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except (ConnectionError, ssl.SSLError):
                    data = b""
                except (BlockingIOError, ssl.SSLWantReadError):
                    continue
                if not data:
                    closed[s] = time.monotonic() - started
                    selector.unregister(s)
    for s in socks:
        s.close()
    return list(closed.values())


def check_serving(port: int, credentials: Credentials) -> None:
    async def ask() -> int:
        async with aio_channel(f"127.0.0.1:{port}", credentials, traced=False) as ch:
            return (await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)).status

    assert asyncio.run(ask()) == health_pb2.HealthCheckResponse.SERVING


def test_silent_and_idle_plaintext_connections_are_closed_within_their_timeouts():
    async def scenario() -> tuple[list[float], list[float]]:
        async with serving(Credentials.plaintext(), SHORT) as port:

            def attack():
                started = time.monotonic()
                silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(NUM_CONNECTIONS // 2)]
                idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(NUM_CONNECTIONS // 2)]
                for s in idle:
                    s.sendall(H2_PREFACE)
                return (
                    wait_closed(silent, SHORT.handshake_timeout_s + SLACK_S, started),
                    wait_closed(idle, SHORT.idle_timeout_s + SLACK_S, started),
                )

            closed = await asyncio.to_thread(attack)
            await asyncio.to_thread(check_serving, port, Credentials.plaintext())
            return closed

    silent, idle = asyncio.run(scenario())
    assert max(silent) < SHORT.handshake_timeout_s + SLACK_S, f"{sum(t == float('inf') for t in silent)} silent connections held"
    assert max(idle) < SHORT.idle_timeout_s + SLACK_S, f"{sum(t == float('inf') for t in idle)} idle connections held"
    print(f"silent: all {len(silent)} closed by {max(silent):.2f} s; idle HTTP/2: all {len(idle)} by {max(idle):.2f} s")


def _tls_files(tmp_path: Path) -> tuple[Credentials, Credentials, ssl.SSLContext]:
    ca = certs.create_ca()
    server = certs.issue_server(ca, "controlplane")
    client = certs.issue(ca, Identity(Role.ADMIN, "idler"))
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    (tmp_path / "client.pem").write_bytes(client.cert_pem)
    (tmp_path / "client.key").write_bytes(client.key_pem)
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    context.load_cert_chain(str(tmp_path / "client.pem"), str(tmp_path / "client.key"))
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    return (
        Credentials(ca.cert_pem, server.cert_pem, server.key_pem, source="test"),
        Credentials(ca.cert_pem, client.cert_pem, client.key_pem, source="test"),
        context,
    )


def test_tls_connections_that_stall_before_or_after_the_handshake_are_closed(tmp_path):
    server_credentials, client_credentials, context = _tls_files(tmp_path)

    async def scenario() -> tuple[list[float], list[float]]:
        async with serving(server_credentials, SHORT) as port:

            def attack():
                started = time.monotonic()
                no_hello = [socket.create_connection(("127.0.0.1", port)) for _ in range(NUM_CONNECTIONS // 2)]
                # A full TLS handshake with a genuine client certificate, then nothing at all.
                quiet = [context.wrap_socket(socket.create_connection(("127.0.0.1", port))) for _ in range(20)]
                return (
                    wait_closed(no_hello, SHORT.handshake_timeout_s + SLACK_S, started),
                    wait_closed(quiet, SHORT.handshake_timeout_s + SLACK_S, started),
                )

            closed = await asyncio.to_thread(attack)
            await asyncio.to_thread(check_serving, port, client_credentials)
            return closed

    no_hello, quiet = asyncio.run(scenario())
    assert max(no_hello) < SHORT.handshake_timeout_s + SLACK_S, f"{sum(t == float('inf') for t in no_hello)} held"
    assert max(quiet) < SHORT.handshake_timeout_s + SLACK_S, f"{sum(t == float('inf') for t in quiet)} held"
    print(f"no ClientHello: all closed by {max(no_hello):.2f} s; TLS done, no HTTP/2: all closed by {max(quiet):.2f} s")


def test_connections_beyond_the_cap_are_closed_at_once_and_the_server_recovers():
    cap = 50
    limits = ConnectionLimits(handshake_timeout_s=2.0, idle_timeout_s=60.0, max_connections=cap)

    async def scenario() -> list[float]:
        async with serving(Credentials.plaintext(), limits) as port:

            def attack() -> list[float]:
                started = time.monotonic()
                socks = []
                for _ in range(3 * cap):
                    socks.append(socket.create_connection(("127.0.0.1", port)))
                    time.sleep(0.002)  # in order: the first `cap` are the ones held
                return wait_closed(socks, limits.handshake_timeout_s + SLACK_S, started)

            closed = await asyncio.to_thread(attack)
            # The held ones are gone after their handshake timeout: a real client gets in.
            await asyncio.to_thread(check_serving, port, Credentials.plaintext())
            return closed

    closed = asyncio.run(scenario())
    early = [t for t in closed if t < limits.handshake_timeout_s / 2]
    assert len(early) >= 2 * cap - 5, f"only {len(early)} of the {2 * cap} connections over the cap were closed at once"
    assert max(closed) < limits.handshake_timeout_s + SLACK_S


def test_a_second_server_cannot_take_a_port_in_use():
    async def scenario() -> None:
        async with serving(Credentials.plaintext(), ConnectionLimits()) as port:
            second = make_server()
            try:
                with pytest.raises(RuntimeError):
                    if add_port(second, f"127.0.0.1:{port}", Credentials.plaintext()) == 0:
                        raise RuntimeError("add_port returned 0")
            finally:
                await second.stop(0)

    asyncio.run(scenario())
