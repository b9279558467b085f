"""A real Agent service over loopback gRPC beside a real reference engine; the tests play the
control plane (they hold the ticket-signing key, SIGNER) and, where needed, the peer agent."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from kvplane import tickets
from kvplane.dataplane import engines
from kvplane.dataplane.agent.config import AgentConfig
from kvplane.dataplane.agent.service import AgentService
from kvplane.dataplane.engines import EngineAdapter
from kvplane.dataplane.engines.reference import EngineConfig
from kvplane.dataplane.transport import make_transport
from kvplane.grpc_util import aio_channel, make_server
from kvplane.security.credentials import Credentials
from kvplane.types import Role
from kvplane.v1 import agent_pb2, agent_pb2_grpc, common_pb2

SIGNER = tickets.TicketSigner(tickets.new_signing_key())
PLAINTEXT = Credentials.plaintext(source="agent tests")


def generate_ticket(
    request_id: str, worker_id: str, source: str = "", prompt=(), cache_salt: str = "", now: float | None = None
) -> common_pb2.Ticket:
    """A generate ticket for `worker_id` (and `source` as its prefill/KV peer), bound to this request."""
    return SIGNER.issue(
        tickets.GENERATE, worker_id, request_id=request_id, prefill_worker_id=source, prompt_token_ids=list(prompt),
        cache_salt=cache_salt, now=now,
    )  # fmt: skip


def ticketed(request: agent_pb2.AgentGenerateRequest, worker_id: str, now: float | None = None) -> agent_pb2.AgentGenerateRequest:
    """`request` with the ticket the control plane would give it for `worker_id` (its prefill source and sampling included)."""
    request.ticket.CopyFrom(SIGNER.issue_generate(request, worker_id, now=now))
    return request


def op_ticket(operation: str, worker_id: str, now: float | None = None) -> common_pb2.Ticket:
    return SIGNER.issue(operation, worker_id, now=now)


@dataclass(frozen=True, slots=True)
class RunningAgent:
    service: AgentService
    engine: EngineAdapter
    stub: agent_pb2_grpc.AgentStub
    endpoint: str


@contextlib.asynccontextmanager
async def serve_agent(
    worker_id: str,
    role: Role = Role.BOTH,
    *,
    engine: EngineAdapter | None = None,
    engine_config: EngineConfig | None = None,
    transports: tuple[str, ...] = ("grpc",),
    clock: Callable[[], float] = time.time,
    service_class: type[AgentService] = AgentService,
    verifier: tickets.TicketVerifier | None = None,
    **config_overrides: object,
) -> AsyncIterator[RunningAgent]:
    """Starts `engine` (default: a reference engine with 64 blocks) and an agent service over it
    (`service_class`: a subclass plays a compromised worker that runs the real code, then cheats;
    `verifier`: the ticket verifier it holds, by default one with the test signer's key)."""
    if engine is None:
        engine = engines.create("reference", engine_config or EngineConfig(num_blocks=64))
    await engine.start()
    config = AgentConfig(worker_id=worker_id, role=role, **config_overrides).validate()  # type: ignore[arg-type]
    server = make_server()
    endpoint = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    kv = engine.kv_transfer
    made = {name: make_transport(name, kv.pool, agent_name=worker_id) for name in transports} if kv is not None else {}
    verifier = verifier or tickets.TicketVerifier(SIGNER.public_key)
    service = service_class(config, engine, made, lambda: verifier, endpoint, clock=clock, credentials=PLAINTEXT)
    agent_pb2_grpc.add_AgentServicer_to_server(service, server)
    await server.start()
    service.start()
    channel = aio_channel(endpoint, PLAINTEXT)
    try:
        yield RunningAgent(service, engine, agent_pb2_grpc.AgentStub(channel), endpoint)
    finally:
        await channel.close()
        await server.stop(0)
        await service.close()
        await engine.stop()


async def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Returns once predicate() holds; fails the test after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting until {what}")
        await asyncio.sleep(0.01)


class ManualClock:
    """A wall clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
