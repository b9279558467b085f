"""A secure local cluster (mutual TLS, throw-away CA) and raw gRPC access to it as any identity.

The attacks in this package use the project's own protos over plain grpc channels, as an attacker
on the same network would, holding whatever credentials the test gives them.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from kvplane.apps.cluster import LocalCluster
from kvplane.grpc_util import channel
from kvplane.security.identity import Identity, Role
from kvplane.v1 import agent_pb2, agent_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2, registry_pb2_grpc

MAX_WORKERS = 6


# The attacks here are met by credentials, tenancy and cache credit. The planner's other defence,
# discounting a worker whose measured TTFT runs far above its reports (core/trust.py, tested in
# tests/core/test_core_trust.py), is off: on a loaded machine a restarted decode-0's slow warm-up
# and one more slow request can discount it for 30 s, and the next test's evil worker would draw
# requests because decode-0 was slow, not because of its claims.
NO_TRUST_DISCOUNT = ("--report-contradiction-min-s", "3600")


@pytest.fixture(scope="package")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(
        num_prefill=1, num_decode=1,
        controlplane_args=("--disagg-threshold", "32", "--max-workers", str(MAX_WORKERS), "--rate-limit", "20", "--rate-burst", "40",
                           *NO_TRUST_DISCOUNT),
    ) as running:  # fmt: skip
        yield running


class As:
    """Raw stubs on channels that present `identity`'s certificate (None: the cluster's admin)."""

    def __init__(self, cluster: LocalCluster, identity: Identity | None = None) -> None:
        credentials = cluster.credentials.admin if identity is None else cluster.credentials.for_identity(identity)
        self.identity = identity
        self._cluster = cluster
        self._credentials = credentials
        self._channels: list[grpc.Channel] = []

    def _channel(self, endpoint: str) -> grpc.Channel:
        made = channel(endpoint, self._credentials)
        self._channels.append(made)
        return made

    def kvplane(self) -> client_pb2_grpc.KvplaneStub:
        return client_pb2_grpc.KvplaneStub(self._channel(self._cluster.endpoint))

    def registry(self) -> registry_pb2_grpc.RegistryStub:
        return registry_pb2_grpc.RegistryStub(self._channel(self._cluster.endpoint))

    def agent(self, worker_id: str) -> agent_pb2_grpc.AgentStub:
        return agent_pb2_grpc.AgentStub(self._channel(self._cluster.worker_endpoints[worker_id]))

    def close(self) -> None:
        for made in self._channels:
            made.close()


@pytest.fixture
def as_identity(cluster):
    opened: list[As] = []

    def make(identity: Identity | None = None) -> As:
        opened.append(As(cluster, identity))
        return opened[-1]

    yield make
    for one in opened:
        one.close()


def tenant(name: str) -> Identity:
    return Identity(Role.CLIENT, "app", name)


def worker(name: str) -> Identity:
    return Identity(Role.WORKER, name)


def place(stub, prompt, max_tokens: int, **fields) -> client_pb2.Placement:
    """A lookaside placement of `prompt` through the caller's Kvplane stub."""
    request = client_pb2.GenerateRequest(
        token_ids=client_pb2.TokenIds(ids=prompt), sampling=common_pb2.SamplingParams(max_tokens=max_tokens), lookaside=True, **fields
    )
    return stub.Route(request, timeout=30).placement


def cancel(stub, placement: client_pb2.Placement) -> None:
    stub.Report(client_pb2.ReportRequest(placement_id=placement.placement_id, event=client_pb2.ReportRequest.CANCELLED), timeout=10)


def learned_salt(stub) -> str:
    """The caller's tenant's cache salt as a worker learns it from any request of that tenant it
    runs (the agent request carries it): read here from a lookaside placement, then cancelled."""
    placement = place(stub, [1, 2, 3, 4], 1, disagg=common_pb2.DISAGG_MODE_NEVER)
    cancel(stub, placement)
    return agent_pb2.AgentGenerateRequest.FromString(placement.agent_request).cache_salt


def rpc_error(call, *args, **kwargs) -> grpc.RpcError:
    """The error a unary call (or a drained stream) fails with; fails the test if it succeeds."""
    try:
        result = call(*args, **kwargs)
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)) and not hasattr(result, "ListFields"):
            list(result)
    except grpc.RpcError as e:
        return e
    raise AssertionError(f"{call} succeeded; it should have been refused")


def serving(cluster: LocalCluster) -> None:
    """The cluster still serves: both workers listed, and a request runs end to end."""
    with cluster.client(timeout=60) as client:
        assert {w.worker_id for w in client.workers()} >= {"prefill-0", "decode-0"}
        result = client.generate([5, 6, 7, 8, 9], max_tokens=2)
        assert len(result.token_ids) == 2


def worker_info(cluster: LocalCluster, worker_id: str, copy_of: str = "decode-0"):
    """A plausible registration for `worker_id`, copied from a real worker's."""
    admin = As(cluster)
    try:
        reply = admin.kvplane().ListWorkers(client_pb2.ListWorkersRequest(), timeout=10)
    finally:
        admin.close()
    info = next(w.info for w in reply.workers if w.info.worker_id == copy_of)
    info.worker_id = worker_id
    info.endpoint = "127.0.0.1:9"
    return info
