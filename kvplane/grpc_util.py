"""gRPC plumbing shared by every kvplane server and client: options, health, reflection, tracing."""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from kvplane.grpc_bad_request import BadRequestInterceptor
from kvplane.telemetry.grpc_tracing import client_interceptors, server_interceptors

MAX_MESSAGE_BYTES = 64 * 1024 * 1024

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Loopback peers: keep connections warm so the first request after idle is not slow.
    ("grpc.keepalive_time_ms", 30_000),
    # A peer that restarts (a supervised agent, a replica) is back within seconds: without a cap,
    # gRPC's reconnect back-off grows to minutes and every call meanwhile fails at once.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)


def make_server() -> grpc.aio.Server:
    # Undecodable requests get INVALID_ARGUMENT; tracing interceptors only when tracing is on.
    return grpc.aio.server(options=CHANNEL_OPTIONS, interceptors=[BadRequestInterceptor(), *server_interceptors()])


def enable_health_and_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> health.aio.HealthServicer:
    """Registers grpc.health.v1 (all services SERVING) and server reflection."""
    names = list(service_names)
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    return servicer


async def set_serving(servicer: health.aio.HealthServicer, service_names: Iterable[str], serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    await servicer.set("", status)
    for name in service_names:
        await servicer.set(name, status)


def aio_channel(endpoint: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS, interceptors=client_interceptors(endpoint))
