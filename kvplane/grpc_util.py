"""gRPC plumbing shared by every kvplane server and client: credentials, limits, health, reflection, tracing.

Every server and channel is made here, from a `kvplane.security.Credentials`: mutual TLS when it
has certificates, plaintext only when it says `insecure`; a bearer token, when it has one, rides
on every call. So no other module chooses between secure and insecure itself.

Message sizes: a server accepts requests of at most SERVER_MAX_RECEIVE_BYTES (8 MiB); it may send
up to MAX_MESSAGE_BYTES, because KV chunks flow from the serving agent to the puller.

Connections: every server closes connections that stall their handshake, sit idle, or stop
answering pings, and caps how many it holds (kvplane.security.limits.ConnectionLimits). It never
sets SO_REUSEPORT (gRPC's default on Linux): with it, a restarted server and a stuck old one both
bind the port and the kernel splits new connections between them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import grpc

from kvplane.security.auth import AUTHORIZATION
from kvplane.security.credentials import Credentials
from kvplane.security.handlers import RequestGuard
from kvplane.security.limits import SERVER_MAX_RECEIVE_BYTES, ConnectionLimits
from kvplane.security.reload import RenewingChannel
from kvplane.telemetry.grpc_tracing import client_interceptors, server_interceptors
from kvplane.telemetry.probes import probes

if TYPE_CHECKING:
    from grpc_health.v1 import health

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# How long one connection attempt may take: long enough for a loaded machine, short enough that a
# hung peer (SIGSTOPped, its kernel still accepting) is given up on well before a call's deadline.
CONNECT_TIMEOUT_MS = 5_000

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Loopback peers: keep connections warm so the first request after idle is not slow.
    ("grpc.keepalive_time_ms", 30_000),
    # A peer that restarts (a supervised agent, a replica) is back within seconds: without a cap,
    # gRPC's reconnect back-off grows to minutes and every call meanwhile fails at once.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    # Despite its name, gRPC reads this as the time one connection attempt (TCP, TLS handshake,
    # HTTP/2 settings) may take. At 100 ms a TLS handshake with a peer on a loaded machine was cut
    # off ("handshaker shutdown") and the call failed UNAVAILABLE although the peer was up.
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def server_options(
    max_receive_bytes: int = SERVER_MAX_RECEIVE_BYTES, connections: ConnectionLimits | None = None
) -> tuple[tuple[str, int], ...]:
    limits = (connections or ConnectionLimits()).validate()
    return (
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
        # Covers TCP accept to the client's HTTP/2 SETTINGS: a connection that sends nothing, or
        # stops mid-handshake, is closed after it (measured: 300 silent sockets closed in ~1.1 s at 1 s).
        ("grpc.server_handshake_timeout_ms", _ms(limits.handshake_timeout_s)),
        ("grpc.max_connection_idle_ms", _ms(limits.idle_timeout_s)),
        ("grpc.keepalive_time_ms", _ms(limits.keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", _ms(limits.keepalive_timeout_s)),
        # Beyond the cap gRPC closes a new connection on accept (no per-peer variant exists).
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        ("grpc.max_concurrent_streams", limits.max_streams_per_connection),
    )


def make_server(
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    max_receive_bytes: int = SERVER_MAX_RECEIVE_BYTES,
    connections: ConnectionLimits | None = None,
) -> grpc.aio.Server:
    """A grpc.aio server; malformed requests are INVALID_ARGUMENT (RequestGuard), then `interceptors`
    (authentication) run, then tracing's, which is on only when enabled. `connections`: its
    timeouts and connection cap (default: ConnectionLimits())."""
    return grpc.aio.server(
        options=server_options(max_receive_bytes, connections), interceptors=[RequestGuard(), *interceptors, *server_interceptors()]
    )


def add_port(server: grpc.aio.Server, address: str, credentials: Credentials) -> int:
    """Listens on `address` with mutual TLS, or in plaintext when the credentials say insecure; returns the port (0 = failed)."""
    if credentials.insecure:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, credentials.server_credentials())


def enable_health_and_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> health.aio.HealthServicer:
    """Registers grpc.health.v1 (all services SERVING) and server reflection."""
    # Servers only: the SDK's base install (grpcio, protobuf) has neither package.
    from grpc_health.v1 import health, health_pb2_grpc  # noqa: PLC0415
    from grpc_reflection.v1alpha import reflection  # noqa: PLC0415

    names = list(service_names)
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    return servicer


async def set_serving(servicer: health.aio.HealthServicer, service_names: Iterable[str], serving: bool) -> None:
    from grpc_health.v1 import health_pb2  # noqa: PLC0415

    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    probes.set_serving(servicer, serving)  # the metrics port's /readyz says the same (kubelet probes under mTLS)
    await servicer.set("", status)
    for name in service_names:
        await servicer.set(name, status)


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return ((AUTHORIZATION, f"Bearer {token}"),)


class _AioBearer(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer TOKEN` to every call of a grpc.aio channel."""

    def __init__(self, token: str) -> None:
        self._metadata = _bearer(token)

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(tuple(d.metadata) if d.metadata else ()), *self._metadata)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _SyncBearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """The same for a blocking grpc channel."""

    def __init__(self, token: str) -> None:
        self._metadata = _bearer(token)

    def _details(self, d):
        return _SyncCallDetails(d.method, d.timeout, (*(d.metadata or ()), *self._metadata), d.credentials, d.wait_for_ready, d.compression)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)


class _SyncCallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression) -> None:
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


def aio_channel(endpoint: str, credentials: Credentials, *, traced: bool = True) -> grpc.aio.Channel:
    """A grpc.aio channel to `endpoint` with these credentials (and tracing when it is on and `traced`;
    the SDK traces its calls itself)."""
    tracing = (client_interceptors(endpoint) or ()) if traced else ()
    interceptors = [*tracing, *([_AioBearer(credentials.token)] if credentials.token else [])]
    if credentials.insecure:
        return grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS, interceptors=interceptors or None)
    options = (*CHANNEL_OPTIONS, *credentials.channel_options())
    if credentials.files is not None:  # certificates rotate on disk: a new channel after each change
        return RenewingChannel(
            credentials.files,
            lambda m: grpc.aio.secure_channel(endpoint, grpc.ssl_channel_credentials(m.ca_pem, m.key_pem, m.cert_pem),
                                              options=options, interceptors=interceptors or None),
        )  # fmt: skip
    return grpc.aio.secure_channel(endpoint, credentials.channel_credentials(), options=options, interceptors=interceptors or None)


def channel(endpoint: str, credentials: Credentials) -> grpc.Channel:
    """A blocking grpc channel to `endpoint` with these credentials."""
    if credentials.insecure:
        made = grpc.insecure_channel(endpoint, options=CHANNEL_OPTIONS)
    else:
        made = grpc.secure_channel(endpoint, credentials.channel_credentials(), options=(*CHANNEL_OPTIONS, *credentials.channel_options()))
    return grpc.intercept_channel(made, _SyncBearer(credentials.token)) if credentials.token else made
