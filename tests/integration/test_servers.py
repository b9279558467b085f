"""Every server speaks gRPC health checking and server reflection; drain takes a worker out of routing."""

from __future__ import annotations

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from kvplane import Client
from kvplane.grpc_util import channel as channel_to

from .helpers import prompt_ids

pytestmark = pytest.mark.cluster  # starts processes


def _endpoints(cluster) -> dict[str, str]:
    return {"controlplane": cluster.endpoint, **cluster.worker_endpoints}


def _services(endpoint: str, credentials) -> set[str]:
    with channel_to(endpoint, credentials) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(iter(stub.ServerReflectionInfo(iter([request]), timeout=10)))
        return {s.name for s in reply.list_services_response.service}


@pytest.mark.parametrize("name, service", [
    ("controlplane", "kvplane.v1.Kvplane"),
    ("controlplane", "kvplane.v1.Registry"),
    ("prefill-0", "kvplane.v1.Agent"),
    ("decode-0", "kvplane.v1.Agent"),
])  # fmt: skip
def test_health_and_reflection(disagg_cluster, name, service):
    endpoint = _endpoints(disagg_cluster)[name]
    credentials = disagg_cluster.credentials.admin  # with mTLS, health and reflection need a cluster certificate too
    with channel_to(endpoint, credentials) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for probe in ("", service):
            reply = health.Check(health_pb2.HealthCheckRequest(service=probe), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert {service, "grpc.health.v1.Health"} <= _services(endpoint, credentials)


def test_drained_worker_finishes_nothing_new_and_leaves_routing():
    from kvplane.apps.cluster import LocalCluster

    with LocalCluster(num_prefill=0, num_decode=0, num_both=2) as cluster, Client(cluster.endpoint, timeout=60) as client:
        before = client.generate(prompt_ids(seed=30, length=40), max_tokens=3, disagg="never")
        drained = before.metrics.decode_worker
        other = next(w for w in ("both-0", "both-1") if w != drained)
        assert client.drain(drained).state.value == "draining"
        states = {w.worker_id: w.state.value for w in client.workers()}
        assert states[drained] == "draining"
        for seed in range(31, 35):
            after = client.generate(prompt_ids(seed=30, length=40) + [seed], max_tokens=3, disagg="never")
            assert after.metrics.decode_worker == other
