"""Runs one control plane replica: store, cluster view, Registry + Kvplane services.

Every call passes the AuthInterceptor first (kvplane.security.auth, with controlplane/access.py's
policy): mutual TLS or bearer tokens say who calls, the policy says whether they may.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass, field

import grpc

from kvplane import telemetry, tickets
from kvplane.controlplane import access, gc_tuning, observe, secrets
from kvplane.controlplane.bus import Bus, open_bus
from kvplane.controlplane.bus_keepalives import OUTCOMES, BusKeepAlives
from kvplane.controlplane.client_service import AgentStubs, ClientService
from kvplane.controlplane.cluster_state import ClusterState
from kvplane.controlplane.config import ControlPlaneConfig
from kvplane.controlplane.registry_service import RegistryService
from kvplane.controlplane.store import open_store
from kvplane.controlplane.store.base import Store
from kvplane.controlplane.tokenizer import PromptTokenizer
from kvplane.grpc_util import add_port, enable_health_and_reflection, make_server, set_serving
from kvplane.security.auth import Authenticator, AuthInterceptor, TokenTable
from kvplane.security.credentials import Credentials
from kvplane.security.ratelimit import RateLimiter
from kvplane.types import WorkerId
from kvplane.v1 import client_pb2, client_pb2_grpc, registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)

BUS_DROP_S = 2.0  # fault injection: how long a replica misses bus messages after SIGUSR1

SERVICE_NAMES = (
    client_pb2.DESCRIPTOR.services_by_name["Kvplane"].full_name,
    registry_pb2.DESCRIPTOR.services_by_name["Registry"].full_name,
)


@dataclass(frozen=True, slots=True)
class ControlPlaneSecurity:
    """What a replica presents and whom it lets in: its credentials (mTLS, or --insecure) and the
    bearer tokens it knows (join, admin, --tokens-file). etcd's own TLS and auth are in the config
    (ControlPlaneConfig.store_options)."""

    credentials: Credentials
    tokens: TokenTable = field(default_factory=TokenTable)
    allow_anonymous: bool = True  # plaintext servers only: callers without a token are the anonymous client


class ControlPlane:
    def __init__(self, config: ControlPlaneConfig, security: ControlPlaneSecurity) -> None:
        self.config = config.validate()
        self.security = security
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._store: Store | None = None
        self._bus: Bus | None = None
        self._state: ClusterState | None = None
        self._keepalives: BusKeepAlives | None = None  # agents' keep-alives on the bus (--bus-for-agents)
        self._stubs = AgentStubs(security.credentials)
        self._http = None
        self.http_port: int | None = None
        self.http_scheme = ""  # "https" when the replica runs TLS, "http" with --insecure

    async def start(self) -> int:
        config = self.config
        prompt_tokenizer = PromptTokenizer.from_specs(config.tokenizers)  # before anything starts: a bad one fails here
        self._store = open_store(config.store, **config.store_options)
        cluster_secrets = await secrets.load_or_create(self._store)
        self._bus = open_bus(
            config.bus,
            self._store,
            store_url=config.store,
            kv_compact_every_s=config.kv_compact_every_s,
            tls=config.bus_tls,
            stream_replicas=config.bus_stream_replicas,
            mac_key=cluster_secrets.bus_key,
        )
        await self._bus.start()
        self._state = ClusterState(
            self._store, bus=self._bus, credit_routed_only=not config.trust_worker_cache_claims,
            bus_keys=cluster_secrets if config.bus_for_agents else None, batch_limits=config.batch_limits,
        )  # fmt: skip
        await self._state.start()
        observe.register_cluster_gauges(self._state)
        authenticator = Authenticator(
            tls=self.security.credentials.tls, tokens=self.security.tokens, allow_anonymous=self.security.allow_anonymous
        )
        limiter = RateLimiter(config.rate_limit_rps, config.rate_limit_burst)
        server = make_server([AuthInterceptor(authenticator, access.policy(), limiter)], connections=config.connection_limits)
        signer = tickets.TicketSigner(cluster_secrets.signing_key, config.ticket_ttl_s)
        service = ClientService(
            self._state, self._store, config, signer, self._stubs, prompt_tokenizer, cache_salt_key=cluster_secrets.cache_salt_key
        )
        service.metrics_url = telemetry.metrics_url(config.host)
        observe.register_planner_gauges(service.planner, time.monotonic)  # the service's clock (its default)
        client_pb2_grpc.add_KvplaneServicer_to_server(service, server)
        state = self._state
        registry = RegistryService(
            self._store, config, cluster_secrets,
            num_workers=lambda: len(state.workers), blocks_of=lambda worker_id: state.index.num_blocks(WorkerId(worker_id)),
            snapshot_requested=state.snapshot_requested, bus=self._bus, lease_of=state.lease_of,
            registered=lambda: (entry.info for entry in state.workers.values()),
        )  # fmt: skip
        registry_pb2_grpc.add_RegistryServicer_to_server(registry, server)
        if config.bus_for_agents and hasattr(self._bus, "serve_keepalives"):  # agents on the bus renew their leases there too
            self._keepalives = BusKeepAlives(
                self._store, cluster_secrets, snapshot_requested=state.snapshot_requested, answer=self._bus.answer,
                max_ttl_s=config.max_lease_ttl_s,
            )  # fmt: skip
            await self._bus.serve_keepalives(self._keepalives.handle)
        keepalives = self._keepalives
        observe.register_keepalive_counter(lambda: keepalives.outcomes if keepalives else dict.fromkeys(OUTCOMES, 0))
        self._health = enable_health_and_reflection(server, SERVICE_NAMES)
        self.port = add_port(server, f"{config.host}:{config.port}", self.security.credentials)
        if self.port == 0:
            raise RuntimeError(f"cannot listen on {config.host}:{config.port} (port in use?)")
        await server.start()
        await set_serving(self._health, SERVICE_NAMES, True)
        self._server = server
        log.info(
            "control plane serving on %s:%d (store %s, bus %s, %s, %d bearer tokens)",
            config.host, self.port, config.store, self._bus.name, self.security.credentials.describe(), len(self.security.tokens),
        )  # fmt: skip
        if self.config.http_port >= 0:
            from kvplane.controlplane.http.guard import BodyLimits
            from kvplane.controlplane.http.server import HttpFace, loopback_address

            self._http = HttpFace(
                loopback_address(self.config.host, self.port), self.config.host, self.config.http_port, self.security.credentials,
                authenticator=authenticator, body_limits=BodyLimits(config.http_max_body_bytes, config.http_body_timeout_s),
            )  # fmt: skip
            self.http_port = await self._http.start()
            self.http_scheme = self._http.scheme
            log.info("OpenAI-compatible HTTP API on %s://%s:%d/v1", self._http.scheme, self.config.host, self.http_port)
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
        if self._keepalives:
            await self._keepalives.close()
        await self._stubs.close()
        if self._bus:
            await self._bus.close()
        if self._store:
            await self._store.close()

    async def wait(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()


async def serve(config: ControlPlaneConfig, security: ControlPlaneSecurity, ready_line: bool = True) -> None:
    plane = ControlPlane(config, security)
    port = await plane.start()
    gc_tuning.tune_for_serving()
    if ready_line:
        print(f"kvplane control plane listening on {config.host}:{port}", flush=True)
        if plane.http_port is not None:
            print(f"kvplane HTTP API (OpenAI-compatible) on {plane.http_scheme}://{config.host}:{plane.http_port}/v1", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if config.fault_injection:
        log.warning("fault injection is on: SIGUSR1 makes this replica drop the bus messages it receives for %.0f s", BUS_DROP_S)
        loop.add_signal_handler(signal.SIGUSR1, plane.state.drop_bus_messages, BUS_DROP_S)
    await stop.wait()
    log.info("stopping control plane")
    await plane.stop()
    telemetry.shutdown()
