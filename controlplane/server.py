"""Runs one control plane replica: store, cluster view, Registry + Kvplane services."""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal

import grpc

from controlplane import keys
from controlplane.client_service import AgentStubs, ClientService
from controlplane.cluster_state import ClusterState
from controlplane.config import ControlPlaneConfig
from controlplane.registry_service import RegistryService
from controlplane.store import open_store
from controlplane.store.base import Compare, Put, Store
from kvplane import telemetry
from kvplane.grpc_util import enable_health_and_reflection, make_server, set_serving
from kvplane.v1 import client_pb2, client_pb2_grpc, registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    client_pb2.DESCRIPTOR.services_by_name["Kvplane"].full_name,
    registry_pb2.DESCRIPTOR.services_by_name["Registry"].full_name,
)


async def ensure_ticket_key(store: Store) -> bytes:
    """The cluster's ticket key: created by the first replica, read by every later one."""
    await store.transaction(
        [Compare.absent(keys.TICKET_KEY)],
        [Put(keys.TICKET_KEY, secrets.token_bytes(32))],
    )
    kv = await store.get(keys.TICKET_KEY)
    assert kv is not None
    return kv.value


class ControlPlane:
    def __init__(self, config: ControlPlaneConfig) -> None:
        self.config = config.validate()
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._store: Store | None = None
        self._state: ClusterState | None = None
        self._stubs = AgentStubs()
        self._http = None
        self.http_port: int | None = None

    async def start(self) -> int:
        self._store = open_store(self.config.store)
        ticket_key = await ensure_ticket_key(self._store)
        self._state = ClusterState(self._store)
        await self._state.start()
        server = make_server()
        service = ClientService(self._state, self._store, self.config, ticket_key, self._stubs)
        service.metrics_url = telemetry.metrics_url(self.config.host)
        client_pb2_grpc.add_KvplaneServicer_to_server(service, server)
        registry_pb2_grpc.add_RegistryServicer_to_server(RegistryService(self._store, self.config, ticket_key), server)
        self._health = enable_health_and_reflection(server, SERVICE_NAMES)
        self.port = server.add_insecure_port(f"{self.config.host}:{self.config.port}")
        if self.port == 0:
            raise RuntimeError(f"cannot listen on {self.config.host}:{self.config.port} (port in use?)")
        await server.start()
        await set_serving(self._health, SERVICE_NAMES, True)
        self._server = server
        log.info("control plane serving on %s:%d (store %s)", self.config.host, self.port, self.config.store)
        if self.config.http_port >= 0:
            from controlplane.http.server import HttpFace, loopback_address

            self._http = HttpFace(loopback_address(self.config.host, self.port), self.config.host, self.config.http_port)
            self.http_port = await self._http.start()
            log.info("OpenAI-compatible HTTP API on http://%s:%d/v1", self.config.host, self.http_port)
        return self.port

    @property
    def state(self) -> ClusterState:
        assert self._state is not None
        return self._state

    async def stop(self, grace: float = 2.0) -> None:
        if self._http:
            await self._http.stop()
        if self._server:
            await set_serving(self._health, SERVICE_NAMES, False)
            await self._server.stop(grace)
        if self._state:
            await self._state.stop()
        await self._stubs.close()
        if self._store:
            await self._store.close()

    async def wait(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()


async def serve(config: ControlPlaneConfig, ready_line: bool = True) -> None:
    plane = ControlPlane(config)
    port = await plane.start()
    if ready_line:
        print(f"kvplane control plane listening on {config.host}:{port}", flush=True)
        if plane.http_port is not None:
            print(f"kvplane HTTP API (OpenAI-compatible) on http://{config.host}:{plane.http_port}/v1", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping control plane")
    await plane.stop()
    telemetry.shutdown()
