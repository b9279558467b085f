"""An agent starting against a replica that hangs inside Register (it may have stored the
registration, then stopped before replying) gives that call up after REGISTER_TIMEOUT_S and
registers through the next replica, instead of exiting. Two fake registries over loopback gRPC
play the replicas."""

from __future__ import annotations

import asyncio

import grpc

from kvplane.dataplane.agent import link as link_module
from kvplane.dataplane.agent.config import AgentConfig
from kvplane.dataplane.agent.link import ControlPlaneLink
from kvplane.security.credentials import Credentials
from kvplane.v1 import common_pb2, registry_pb2

from .test_link_latency import FakeRegistry, serve_registry


def _idle_link(controlplane: str) -> ControlPlaneLink:
    """Worker w1's link to `controlplane` (comma-separated replicas): idle, no cache, no model."""
    load = common_pb2.WorkerLoad()
    return ControlPlaneLink(
        AgentConfig(worker_id="w1", controlplane=controlplane).validate(),
        info=lambda: common_pb2.WorkerInfo(worker_id="w1"),
        load=lambda: (load, common_pb2.WORKER_STATE_ACTIVE),
        take_events=lambda: [],
        snapshot=lambda: [],
        latency=lambda: None,
        on_profile=lambda stored: None,
        credentials=Credentials.plaintext(source="test"),
    )


class HungRegistry(FakeRegistry):
    """Takes the Register call and never answers it (a replica stopped mid-call)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.registers = 0

    async def Register(self, request, context):
        self.registers += 1
        await asyncio.sleep(3600)


def test_a_register_that_hangs_on_one_replica_is_retried_on_the_next(monkeypatch):
    monkeypatch.setattr(link_module, "REGISTER_TIMEOUT_S", 1.0)

    async def scenario() -> tuple[HungRegistry, int, bool]:
        hung, healthy = HungRegistry(), FakeRegistry(None)
        (hung_server, hung_at), (healthy_server, healthy_at) = await serve_registry(hung), await serve_registry(healthy)
        link = _idle_link(f"{hung_at},{healthy_at}")
        try:
            await link.start(timeout_s=20)
            return hung, link.lease_id, link.endpoint == healthy_at
        finally:
            await link.stop()
            await hung_server.stop(0)
            await healthy_server.stop(0)

    hung, lease_id, on_healthy = asyncio.run(scenario())
    assert hung.registers == 1 and on_healthy and lease_id == 7  # the healthy replica's lease


class LapsedFirstLeaseRegistry(FakeRegistry):
    """The first registration's lease lapses before its first snapshot arrives (a replica too
    busy to answer within the TTL): that snapshot is refused as the registry refuses it."""

    def __init__(self) -> None:
        super().__init__(None)
        self.registers = 0
        self.snapshot_leases: list[int] = []

    async def Register(self, request, context):
        self.registers += 1
        return registry_pb2.RegisterResponse(lease_id=self.registers, ttl_seconds=10, session_token=b"s")

    async def PublishKVEvents(self, request, context):
        self.snapshot_leases.append(request.lease_id)
        if request.lease_id == 1:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"worker {request.worker_id!r} is not registered under lease 1: register again")
        return registry_pb2.PublishKVEventsResponse()


def test_a_start_whose_first_lease_lapsed_before_its_snapshot_registers_again():
    async def scenario() -> tuple[LapsedFirstLeaseRegistry, int]:
        registry = LapsedFirstLeaseRegistry()
        server, address = await serve_registry(registry)
        link = _idle_link(address)
        try:
            await link.start(timeout_s=20)
            return registry, link.lease_id
        finally:
            await link.stop()
            await server.stop(0)

    registry, lease_id = asyncio.run(scenario())
    assert registry.registers == 2 and lease_id == 2
    assert registry.snapshot_leases == [1, 2]  # the refused snapshot, then the new lease's
