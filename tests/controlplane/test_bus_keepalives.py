"""Lease keep-alives on the NATS bus (controlplane/bus_keepalives.py): an agent's BusPublisher asks,
one replica renews the lease in the store and answers. A real nats-server on loopback, the embedded
store; the whole path through a real cluster is in tests/integration/test_bus_nats.py."""

from __future__ import annotations

import asyncio

import pytest

from kvplane.controlplane import keys
from kvplane.controlplane.bus import open_bus
from kvplane.controlplane.bus_keepalives import BusKeepAlives
from kvplane.controlplane.secrets import ClusterSecrets
from kvplane.controlplane.store import MemoryStore
from kvplane.dataplane.agent.bus_publish import BusPublisher
from kvplane.security.credentials import Credentials
from kvplane.v1 import common_pb2, registry_pb2

W, OTHER = "w.1", "w.2"
TTL_S = 2


def _keepalive(worker: str, lease: int, seq: int) -> registry_pb2.KeepAliveRequest:
    return registry_pb2.KeepAliveRequest(worker_id=worker, lease_id=lease, keepalive_seq=seq)


async def _register(store: MemoryStore, worker: str) -> int:
    lease = await store.lease_grant(TTL_S)
    info = common_pb2.WorkerInfo(worker_id=worker, role=common_pb2.ROLE_BOTH, endpoint="h:1", model="m")
    await store.put(keys.worker_key(worker), info.SerializeToString(), lease=lease)
    return lease


@pytest.mark.cluster  # nats-server
def test_a_keepalive_on_the_bus_renews_its_own_lease_only_and_once(nats_factory):
    """The worker's own keep-alives keep its lease past its TTL and carry a snapshot request; one
    signed with another registration's token, or a copy of one answered, is refused (the agent
    then asks over gRPC) and renews nothing; a lease that ended is answered TTL 0; with the store
    gone the answer is an error."""
    server = nats_factory()
    secrets = ClusterSecrets(b"s" * 32, b"k" * 32, b"c" * 32)

    async def body():
        store = MemoryStore()
        replica_bus = open_bus(server.url, store, mac_key=secrets.bus_key)
        await replica_bus.start()
        wanted: set[str] = set()
        keepalives = BusKeepAlives(store, secrets, snapshot_requested=wanted.__contains__, answer=replica_bus.answer, max_ttl_s=60)
        await replica_bus.serve_keepalives(keepalives.handle)
        agent = BusPublisher(server.url, Credentials(), W)
        assert await agent.start()
        try:
            lease, forged_lease = await _register(store, W), await _register(store, OTHER)
            token, other_token = secrets.session_token(W, lease), secrets.session_token(OTHER, forged_lease)
            # Four renewals half a TTL apart: the lease outlives its TTL twice over.
            for seq in range(1, 5):
                reply = await agent.keep_alive(_keepalive(W, lease, seq), token, 5.0)
                assert reply is not None and reply.ttl_seconds == TTL_S and not reply.snapshot_requested
                # Keep-alives for the other registration, signed with W's token: refused, and its lease runs out.
                assert await agent.keep_alive(_keepalive(OTHER, forged_lease, seq), token, 5.0) is None
                await asyncio.sleep(TTL_S / 2)
            assert await store.get(keys.worker_key(W)) is not None
            assert await store.get(keys.worker_key(OTHER)) is None
            # A copy of a keep-alive answered already (the MAC is right) is refused.
            assert await agent.keep_alive(_keepalive(W, lease, 4), token, 5.0) is None
            assert +keepalives.outcomes == {"renewed": 4, "mac": 4, "replayed": 1}  # (+: without the zeros)
            wanted.add(W)
            reply = await agent.keep_alive(_keepalive(W, lease, 5), token, 5.0)
            assert reply is not None and reply.snapshot_requested
            # A lease that ended: TTL 0 (the agent registers again), signed by its own worker.
            await store.lease_revoke(forged_lease)
            reply = await agent.keep_alive(_keepalive(OTHER, forged_lease, 9), other_token, 5.0)
            assert reply is not None and reply.ttl_seconds == 0
            assert keepalives.outcomes["lost"] == 1
            await store.close()
            assert await agent.keep_alive(_keepalive(W, lease, 6), token, 5.0) is None
            assert keepalives.outcomes["store"] == 1
        finally:
            await agent.close()
            await keepalives.close()
            await replica_bus.close()

    asyncio.run(body())


@pytest.mark.cluster
def test_an_agent_whose_bus_has_no_replica_taking_keepalives_sends_them_over_grpc(nats_factory):
    """NATS says at once that nobody serves the subject (an older replica): the publisher answers
    None, the link's cue for a gRPC call, and stops asking on the bus for a while."""
    server = nats_factory()

    async def body():
        agent = BusPublisher(server.url, Credentials(), W)
        assert await agent.start()
        try:
            # Bounded well below the request's own timeout: NATS's no-responders answer, not the timeout, ends it.
            assert await asyncio.wait_for(agent.keep_alive(_keepalive(W, 1, 1), b"t" * 32, 60.0), 20) is None
            assert agent.keepalives_off()
            assert await agent.keep_alive(_keepalive(W, 1, 2), b"t" * 32, 60.0) is None
        finally:
            await agent.close()

    asyncio.run(body())
