"""Transport security: a plaintext connection, a client trusting another CA, a certificate from
another CA and no client certificate all fail against every kind of server, and the SDK says where
it looked for credentials."""

from __future__ import annotations

import grpc
import pytest

from kvplane import Client, UnavailableError
from kvplane.grpc_util import channel
from kvplane.security import certs
from kvplane.security.credentials import Credentials
from kvplane.security.identity import Identity, Role
from kvplane.v1 import agent_pb2, agent_pb2_grpc, client_pb2, client_pb2_grpc

from .conftest import serving

pytestmark = pytest.mark.cluster


def _other_ca_credentials(identity: Identity, trust: bytes | None = None) -> Credentials:
    other = certs.create_ca("someone else's CA")
    pair = certs.issue(other, identity)
    return Credentials(trust or other.cert_pem, pair.cert_pem, pair.key_pem, source="test")


def test_plaintext_wrong_ca_and_missing_client_certificates_fail(cluster):
    local_ca = cluster.credentials.admin.ca_pem
    admin = Identity(Role.ADMIN, "local-admin")
    attempts = {
        "plaintext": Credentials.plaintext(),
        "client trusts another CA": _other_ca_credentials(admin),
        "certificate from another CA": _other_ca_credentials(admin, trust=local_ca),
        "no client certificate": Credentials(ca_pem=local_ca),
    }
    for what, credentials in attempts.items():
        with channel(cluster.endpoint, credentials) as ch:
            with pytest.raises(grpc.RpcError) as info:
                client_pb2_grpc.KvplaneStub(ch).ListWorkers(client_pb2.ListWorkersRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, what
        with channel(cluster.worker_endpoints["decode-0"], credentials) as ch:
            with pytest.raises(grpc.RpcError) as info:
                agent_pb2_grpc.AgentStub(ch).GetStatus(agent_pb2.GetStatusRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, what
    serving(cluster)


def test_the_sdk_finds_the_local_clusters_credentials_and_names_them_when_they_do_not_fit(cluster):
    with Client(cluster.endpoint, timeout=30) as client:  # no credentials given: found on disk
        assert {w.worker_id for w in client.workers()} >= {"decode-0", "prefill-0"}
        assert "local cluster credentials" in client.credentials.source
    with Client(cluster.endpoint, timeout=5, credentials=Credentials.plaintext()) as client:
        with pytest.raises(UnavailableError, match="the client used plaintext"):
            client.workers()
