"""The NATS bus over TLS: nats-server with a certificate from the cluster's CA and client
certificates required (`--tlsverify`); the control plane's `--bus tls://... --bus-ca --bus-cert
--bus-key` reaches it, and a client without a certificate, or in plaintext, does not."""

from __future__ import annotations

import asyncio

import pytest

from kvplane.controlplane.bus import BusUnavailable
from kvplane.controlplane.bus.nats import NatsBus
from kvplane.controlplane.config import ControlPlaneConfig
from kvplane.security import certs
from kvplane.security.identity import Identity, Role
from kvplane.v1 import registry_pb2
from tests.conftest import start_nats

pytestmark = pytest.mark.cluster  # starts nats-server


def test_the_bus_over_tls_needs_the_ca_and_a_client_certificate(tmp_path):
    ca = certs.create_ca()
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    server_cert, server_key = certs.write_pair(tmp_path, "nats", certs.issue_server(ca, "nats", ("127.0.0.1",)))
    client_cert, client_key = certs.write_pair(tmp_path, "cp", certs.issue(ca, Identity(Role.CONTROLPLANE, "controlplane")))
    tls_args = ("--tls", "--tlscert", str(server_cert), "--tlskey", str(server_key), "--tlscacert", str(ca_file), "--tlsverify")
    try:
        server = start_nats(tmp_path / "nats", extra_args=tls_args)
    except FileNotFoundError as e:  # pragma: no cover - make nats installs it
        pytest.fail(str(e))
    try:
        assert server.url.startswith("tls://")
        config = ControlPlaneConfig(bus=server.url, bus_ca=str(ca_file), bus_cert=str(client_cert), bus_key=str(client_key)).validate()

        async def body():
            bus = NatsBus(server.url, tls=config.bus_tls)
            await bus.start()
            messages = await bus.subscribe()
            await bus.publish_kv(registry_pb2.PublishKVEventsRequest(worker_id="w", seq=1, snapshot=True))
            message = await asyncio.wait_for(anext(messages), 10)
            assert registry_pb2.PublishKVEventsRequest.FromString(message.payload).seq == 1
            await bus.close()
            # The CA alone (no client certificate): nats-server refuses the handshake.
            without = ControlPlaneConfig(bus=server.url, bus_ca=str(ca_file)).validate()
            with pytest.raises(BusUnavailable, match="cannot reach NATS"):
                await NatsBus(server.url, tls=without.bus_tls, timeout_s=1.0).start()
            # Plaintext to the TLS port: refused as well.
            with pytest.raises(BusUnavailable, match="cannot reach NATS"):
                await NatsBus(server.url.replace("tls://", "nats://"), timeout_s=1.0).start()

        asyncio.run(body())
    finally:
        server.stop()
