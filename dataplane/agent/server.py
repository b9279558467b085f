"""Runs one agent: engine, KV transports, the Agent gRPC service and the control-plane link.

The engine comes from the engine registry by name (AgentConfig.engine_name); KV transports are
built only over an engine with the KV import/export capability. The agent lives and dies with its
engine: when the engine stops serving for `engine_down_grace_s` (an external engine's server was
killed, the reference engine's step thread died), the agent deregisters and exits with an error,
so its worker leaves routing at once (a sidecar's container is then restarted beside the engine).

Security: the agent serves mutual TLS with its worker certificate (or plaintext with --insecure);
with TLS, its AuthInterceptor admits only the control plane and peer workers (access.py), and
every call that runs work or touches KV must carry a ticket (service.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import grpc

from kvplane import telemetry
from kvplane.dataplane import engines
from kvplane.dataplane.agent import access
from kvplane.dataplane.agent.config import AgentConfig
from kvplane.dataplane.agent.link import ControlPlaneLink
from kvplane.dataplane.agent.observe import register_load_gauges
from kvplane.dataplane.agent.service import AgentService
from kvplane.dataplane.engines.base import EngineAdapter
from kvplane.dataplane.transport import KVTransport, ModeledLinkTransport, available_transports, make_transport
from kvplane.grpc_util import add_port, enable_health_and_reflection, make_server, set_serving
from kvplane.security.auth import Authenticator, AuthInterceptor
from kvplane.security.credentials import Credentials
from kvplane.v1 import agent_pb2, agent_pb2_grpc, common_pb2

log = logging.getLogger(__name__)

SERVICE_NAMES = (agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name,)


class AgentServer:
    def __init__(self, config: AgentConfig, credentials: Credentials) -> None:
        self.config = config.validate()
        self.credentials = credentials
        self.engine: EngineAdapter | None = None
        self.service: AgentService | None = None
        self.link: ControlPlaneLink | None = None
        self.endpoint = ""
        self._server: grpc.aio.Server | None = None
        self._transports: dict[str, KVTransport] = {}

    async def start(self) -> str:
        config = self.config
        # Building an engine is slow and synchronous (weights, a server to reach): keep the event
        # loop responsive meanwhile.
        self.engine = await asyncio.to_thread(engines.create, config.engine_name, config.engine)
        await self.engine.start()
        unhealthy = self.engine.health()
        if unhealthy is not None:
            raise RuntimeError(f"the {config.engine_name} engine did not start: {unhealthy}")
        self._transports = self._make_transports()
        names = list(self._transports)
        # Without TLS there is no caller identity to check: tickets are the agent's whole defence.
        interceptors = [AuthInterceptor(Authenticator(tls=True), access.policy())] if self.credentials.tls else []
        server = make_server(interceptors)
        port = add_port(server, f"{config.host}:{config.port}", self.credentials)
        if port == 0:
            raise RuntimeError(f"cannot listen on {config.host}:{config.port} (port in use?)")
        self.endpoint = f"{config.advertise_host or config.host}:{port}"
        self.link = ControlPlaneLink(
            config,
            info=lambda: self.service.worker_info(),
            load=lambda: (self.service.worker_load(), self.service.state),
            take_events=self.engine.take_kv_events,
            snapshot=self.engine.cached_block_hashes_by_tier,
            latency=lambda: self.service.latency_model_pb(),
            on_profile=lambda profile: self.service.seed_latency(profile),
            credentials=self.credentials,
        )
        self.service = AgentService(
            config, self.engine, self._transports, lambda: self.link.verifier, self.endpoint, credentials=self._peer_credentials
        )
        self.service.metrics_url = telemetry.metrics_url(config.advertise_host or config.host)
        register_load_gauges(self.engine)
        agent_pb2_grpc.add_AgentServicer_to_server(self.service, server)
        self._health = enable_health_and_reflection(server, SERVICE_NAMES)
        await server.start()
        await set_serving(self._health, SERVICE_NAMES, True)
        self._server = server
        self.service.start()
        await self.link.start()
        log.info("agent %s (%s) serving %s with the %s engine on %s, KV transports %s",
                 config.worker_id, config.role.value, self.engine.info.model, config.engine_name, self.endpoint, names)  # fmt: skip
        return self.endpoint

    @property
    def _peer_credentials(self) -> Credentials:
        """What this agent presents to peer agents: its certificate, never the join token (which is
        for the control plane only, and which peers would refuse as an unknown token)."""
        return self.credentials.with_token("")

    def _make_transports(self) -> dict[str, KVTransport]:
        """The configured (or every available) transport over the engine's pool; none without one."""
        config = self.config
        kv = self.engine.kv_transfer
        if kv is None:
            if config.transports:
                raise ValueError(f"the {config.engine_name} engine does not move KV through kvplane transports; drop --transports")
            return {}
        available = available_transports(kv.pool)
        names = list(config.transports) or available
        unknown = [n for n in names if n not in available]
        if unknown:
            raise ValueError(f"KV transports {unknown} are not available here; available: {available}")
        if "nixl" in names and self.credentials.tls:
            log.warning("KV blocks moved over nixl (UCX) are not encrypted or authenticated by kvplane's TLS; see docs/security.md")
        options = {"grpc": {"credentials": self._peer_credentials}, "nixl": {"progress_delay_us": config.nixl_progress_delay_us}}
        transports = {name: make_transport(name, kv.pool, agent_name=config.worker_id, **options[name]) for name in names}
        link = kv.modeled_link
        if link is not None:  # a simulated engine: its KV crosses a modeled link (dataplane/transport/modeled.py)
            transports = {name: ModeledLinkTransport(t, link) for name, t in transports.items()}
        return transports

    async def watch_engine(self, interval_s: float = 0.25) -> str:
        """Returns (the reason) once the engine has not served for engine_down_grace_s."""
        assert self.engine is not None
        down_since: float | None = None
        while True:
            await asyncio.sleep(interval_s)
            reason = self.engine.health()
            if reason is None:
                down_since = None
                continue
            now = time.monotonic()
            down_since = now if down_since is None else down_since
            if now - down_since >= self.config.engine_down_grace_s:
                return reason

    async def drain(self, timeout_s: float) -> None:
        """Takes no new work and waits (bounded) for running requests to finish."""
        assert self.service is not None and self.engine is not None
        self.service.state = common_pb2.WORKER_STATE_DRAINING
        await set_serving(self._health, SERVICE_NAMES, False)
        if self.engine.health() is not None:
            return  # nothing will finish on an engine that does not serve
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            load = self.engine.load()
            if load.num_running + load.num_waiting == 0:
                return
            await asyncio.sleep(0.1)
        log.warning("drain timed out with requests still running; they will be aborted")

    async def stop(self, drain_timeout_s: float = 10.0) -> None:
        if self.service is not None:
            await self.drain(drain_timeout_s)
        if self.link is not None:
            await self.link.stop(deregister=True)
        if self._server is not None:
            await self._server.stop(1.0)
        if self.service is not None:
            await self.service.close()
        for transport in self._transports.values():
            transport.close()
        if self.engine is not None:
            await self.engine.stop()


async def serve(config: AgentConfig, credentials: Credentials, stop: asyncio.Event | None = None) -> None:
    """Runs one agent until SIGINT/SIGTERM or, given `stop` (several agents in one process,
    dataplane/agent/host.py), until it is set; then flushes telemetry only when it owns the signals."""
    agent = AgentServer(config, credentials)
    loop = asyncio.get_running_loop()
    owns_process = stop is None
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    try:
        endpoint = await agent.start()
    except BaseException:
        await agent.stop(drain_timeout_s=0)  # an external engine's connections, a half-built server
        raise
    if config.fault_injection:
        log.warning("fault injection is on: SIGUSR1 drops the next KV event batch, SIGUSR2 cuts the next KV pull served")
        loop.add_signal_handler(signal.SIGUSR1, agent.link.drop_next_batch)
        loop.add_signal_handler(signal.SIGUSR2, agent.service.cut_next_pull)
    print(f"kvplane agent {config.worker_id} listening on {endpoint}", flush=True)
    stopped = asyncio.create_task(stop.wait())
    engine_down = asyncio.create_task(agent.watch_engine())
    await asyncio.wait([stopped, engine_down], return_when=asyncio.FIRST_COMPLETED)
    for task in (stopped, engine_down):
        task.cancel()
    log.info("stopping agent %s", config.worker_id)
    await agent.stop()
    if owns_process:
        telemetry.shutdown()
    if engine_down.done() and not engine_down.cancelled():
        raise RuntimeError(f"the {config.engine_name} engine stopped serving ({engine_down.result()}); this agent lives and dies with it")
