"""A peer whose TLS handshake is slow (a loaded machine) is still reached.

gRPC reads `grpc.min_reconnect_backoff_ms` as the time one connection attempt may take; when it
was 100 ms, a client's first call to a control plane that was up failed UNAVAILABLE with
"handshaker shutdown" whenever the handshake took longer (seen in the engine suite on 2 busy
cores). A loopback proxy here holds every chunk of the connection for a while, so the handshake
takes about two seconds, and both kinds of channel must still get their answer.
"""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvplane.grpc_util import add_port, aio_channel, channel, make_server
from kvplane.security import certs
from kvplane.security.credentials import Credentials
from kvplane.security.identity import Identity, Role

CHUNK_DELAY_S = 0.25  # each of the handshake's ~8 one-way trips through the proxy


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            await asyncio.sleep(CHUNK_DELAY_S)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def _credentials(ca: certs.KeyPair, pair: certs.KeyPair) -> Credentials:
    return Credentials(ca.cert_pem, pair.cert_pem, pair.key_pem, source="test")


def test_a_call_through_a_slow_tls_handshake_is_answered():

    async def scenario() -> list[int]:
        ca = certs.create_ca()
        server = make_server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = add_port(server, "127.0.0.1:0", _credentials(ca, certs.issue_server(ca, "controlplane")))
        await server.start()

        async def relay(client_reader, client_writer):
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.gather(_forward(client_reader, upstream_writer), _forward(upstream_reader, client_writer))

        proxy = await asyncio.start_server(relay, "127.0.0.1", 0)
        endpoint = f"127.0.0.1:{proxy.sockets[0].getsockname()[1]}"
        client = _credentials(ca, certs.issue(ca, Identity(Role.ADMIN, "slow-link")))
        request = health_pb2.HealthCheckRequest()
        statuses = []
        try:
            async with aio_channel(endpoint, client, traced=False) as aio:
                statuses.append((await health_pb2_grpc.HealthStub(aio).Check(request, timeout=30)).status)

            def blocking_call() -> int:
                with channel(endpoint, client) as ch:
                    return health_pb2_grpc.HealthStub(ch).Check(request, timeout=30).status

            statuses.append(await asyncio.to_thread(blocking_call))
        finally:
            proxy.close()
            await server.stop(0)
        return statuses

    serving = health_pb2.HealthCheckResponse.SERVING
    assert asyncio.run(scenario()) == [serving, serving]
