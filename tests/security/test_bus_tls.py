"""The NATS bus over TLS: nats-server with a certificate from the cluster's CA and client
certificates required (`--tlsverify`); the control plane's `--bus tls://... --bus-ca --bus-cert
--bus-key` reaches it, and a client without a certificate, or in plaintext, does not."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from kvplane.apps.cluster import free_port
from kvplane.controlplane.bus import BusUnavailable
from kvplane.controlplane.bus.nats import NatsBus
from kvplane.controlplane.config import ControlPlaneConfig
from kvplane.security import certs
from kvplane.security.identity import Identity, Role
from kvplane.v1 import registry_pb2
from tests.conftest import bus_messages, start_nats

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

pytestmark = pytest.mark.cluster  # starts nats-server


async def _a_batch_comes_back(url: str, tls) -> None:
    """A replica's bus at `url` starts, and a KV batch it publishes is delivered back to it."""
    bus = NatsBus(url, tls=tls)
    await bus.start()
    messages = await bus_messages(bus)
    await bus.publish_kv(registry_pb2.PublishKVEventsRequest(worker_id="w", seq=1, snapshot=True))
    message = await asyncio.wait_for(messages.get(), 10)
    assert registry_pb2.PublishKVEventsRequest.FromString(message.payload).seq == 1
    await bus.close()


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
            await _a_batch_comes_back(server.url, config.bus_tls)
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


def _shipped_nats_config(tmp_path, name, cert, key, ca_file, route_port, peer_port):
    """deploy/k8s/overlays/nats/nats.conf as the overlay mounts it, for a node on loopback: its
    certificate paths point at `cert` / `key` / `ca_file` instead of the pod's secret, and its
    cluster listens on `route_port` and dials `peer_port` instead of the StatefulSet's peers.
    (nats-server's --cluster and --routes flags would replace the whole cluster block, its TLS
    and authorization with it: the file is edited instead.)"""
    text = (DEPLOY / "k8s" / "overlays" / "nats" / "nats.conf").read_text()
    for mounted, path in (("tls.crt", cert), ("tls.key", key), ("ca.crt", ca_file)):
        text = text.replace(f"/etc/nats/tls/{mounted}", str(path))
    assert "listen: 0.0.0.0:6222" in text
    text = text.replace("listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{route_port}")
    text = re.sub(r"routes: \[[^\]]*\]", f'routes: ["nats://127.0.0.1:{peer_port}"]', text)
    out = tmp_path / f"{name}.conf"
    out.write_text(text)
    return out


def _routes(server) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/routez", timeout=2) as reply:
        return json.load(reply)["num_routes"]


def _meta_leader(server) -> str:
    """The JetStream meta group's leader as `server` knows it ("": none elected yet)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/jsz", timeout=2) as reply:
        return (json.load(reply).get("meta_cluster") or {}).get("leader", "")


class _ShippedPair:
    """Two nats-server nodes on loopback with the nats overlay's nats.conf and the NATS server
    certificate, routed to each other, with a JetStream meta leader: `a`'s client URL is `url`."""

    def __init__(self, tmp_path: Path, ca: certs.KeyPair) -> None:
        self.tmp_path = tmp_path
        self.ca_file = tmp_path / "ca.crt"
        self.ca_file.write_bytes(ca.cert_pem)
        # As cert-manager issues it (nats.yaml): the route user's DNS name, server and client usage.
        issued = certs.issue_server(ca, "kvplane-nats", ("kvplane-nats", "127.0.0.1"))
        self.server_cert, self.server_key = certs.write_pair(tmp_path, "nats", issued)
        self.route_a = free_port()
        self.servers = []

    def node(self, name, cert, key, route, peer):
        config = _shipped_nats_config(self.tmp_path, name, cert, key, self.ca_file, route, peer)
        try:
            server = start_nats(self.tmp_path / name, extra_args=("-c", str(config), "--name", name))
        except FileNotFoundError as e:  # pragma: no cover - make nats installs it
            pytest.fail(str(e))
        self.servers.append(server)
        return server

    def __enter__(self) -> _ShippedPair:
        route_b = free_port()
        self.a = self.node("a", self.server_cert, self.server_key, self.route_a, route_b)
        self.node("b", self.server_cert, self.server_key, route_b, self.route_a)
        deadline = time.monotonic() + 15
        while _routes(self.a) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _routes(self.a) == 1, "the two nodes with the NATS server certificate did not form a route"
        while not _meta_leader(self.a):  # JetStream streams can be created once a and b elect a leader
            assert time.monotonic() < deadline, "nodes a and b elected no JetStream meta leader"
            time.sleep(0.1)
        self.url = f"tls://127.0.0.1:{self.a.client_port}"
        return self

    def __exit__(self, *exc) -> None:
        for server in self.servers:
            server.stop()

    def tls(self, cert, key):
        return ControlPlaneConfig(bus=self.url, bus_ca=str(self.ca_file), bus_cert=str(cert), bus_key=str(key)).validate().bus_tls


def test_the_shipped_nats_config_lets_only_the_control_plane_connect_and_only_nats_nodes_route(tmp_path):
    """Every certificate is signed by kvplane-ca, a worker's too. With the overlay's nats.conf
    (certificates mapped to users) the control plane's certificate connects and publishes, a
    worker's is refused on the client port with an error that says what to fix, two nodes with
    the NATS server certificate form a route, and a node presenting a worker's certificate does
    not join them."""
    ca = certs.create_ca()
    cp_cert, cp_key = certs.write_pair(tmp_path, "cp", certs.issue(ca, Identity(Role.CONTROLPLANE, "controlplane")))
    worker_cert, worker_key = certs.write_pair(tmp_path, "worker", certs.issue(ca, Identity(Role.WORKER, "worker-0")))
    with _ShippedPair(tmp_path, ca) as pair:
        c = pair.node("c", worker_cert, worker_key, free_port(), pair.route_a)  # a node presenting a worker's certificate
        # c dials a's route port once a second and a refuses it every time. The refusal is read
        # in a's log: c's own log says "Authorization Violation" or, when a closes first, only
        # "Write Error" (seen in CI).
        deadline = time.monotonic() + 15
        while "Router connection closed: Authentication Failure" not in pair.a.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, "node a never refused the route of the node with a worker's certificate"
            time.sleep(0.1)
        assert _routes(pair.a) == 1 and _routes(c) == 0

        async def body():
            await _a_batch_comes_back(pair.url, pair.tls(cp_cert, cp_key))
            # A worker's certificate, signed by the same CA: no user maps to it.
            with pytest.raises(BusUnavailable, match="refused this replica's certificate .*spiffe://kvplane/controlplane/NAME"):
                await NatsBus(pair.url, tls=pair.tls(worker_cert, worker_key), timeout_s=1.0).start()

        asyncio.run(body())


def _with_subject(ca: certs.KeyPair, issued: certs.KeyPair, subject: x509.Name) -> certs.KeyPair:
    """`issued` signed again by `ca` with `subject` instead of its own (its key, names and usages
    kept): a worker's certificate as cert-manager's csi-driver issues it in the nats-agents
    overlay, whose common-name and organizations attributes give every worker one subject."""
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    builder = x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject).public_key(cert.public_key())
    builder = builder.serial_number(x509.random_serial_number()).not_valid_before(cert.not_valid_before_utc)
    builder = builder.not_valid_after(cert.not_valid_after_utc)
    for extension in cert.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    resigned = builder.sign(serialization.load_pem_private_key(ca.key_pem, password=None), hashes.SHA256())
    return certs.KeyPair(resigned.public_bytes(serialization.Encoding.PEM), issued.key_pem)


def test_with_the_nats_agents_overlay_a_worker_publishes_its_own_messages_and_nothing_else(tmp_path):
    """deploy/k8s/overlays/nats-agents: a worker's certificate carries the subject nats.conf maps
    to the workers' user (issued as cert-manager does it there: O, then CN). Its agent publishes
    a load report and a KV snapshot (acknowledged, then the batches before it purged) and the
    replica receives both, and a keep-alive that a replica answers; the same certificate may not read every worker's reports, nor the
    replicas' consumer deliveries under the default inbox, nor delete a stream, which stays.
    A worker certificate without that subject (the nats overlay's) is still refused."""
    from nats.aio.client import Client

    from kvplane import bus as wire
    from kvplane.controlplane.bus_keepalives import BusKeepAlives
    from kvplane.controlplane.secrets import ClusterSecrets
    from kvplane.controlplane.store import MemoryStore
    from kvplane.dataplane.agent.bus_publish import BusPublisher
    from kvplane.security.credentials import Credentials

    ca = certs.create_ca()
    cp_cert, cp_key = certs.write_pair(tmp_path, "cp", certs.issue(ca, Identity(Role.CONTROLPLANE, "controlplane")))
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "worker"), x509.NameAttribute(NameOID.COMMON_NAME, "kvplane-worker")]
    )
    worker = _with_subject(ca, certs.issue(ca, Identity(Role.WORKER, "prefill-0")), subject)
    other = certs.issue(ca, Identity(Role.WORKER, "prefill-1"))  # its own subject, CN=prefill-1,O=worker
    token = b"t" * 32
    with _ShippedPair(tmp_path, ca) as pair:

        async def body():
            replica = NatsBus(pair.url, tls=pair.tls(cp_cert, cp_key))
            await replica.start()
            messages = await bus_messages(replica)
            store, secrets = MemoryStore(), ClusterSecrets(b"s" * 32, b"k" * 32, b"c" * 32)
            keepalives = BusKeepAlives(store, secrets, snapshot_requested=lambda worker_id: False, answer=replica.answer, max_ttl_s=60)
            # Early: the node the agent connects to learns of the subscription from its peer a moment later.
            await replica.serve_keepalives(keepalives.handle)
            agent = BusPublisher(pair.url, Credentials(ca_pem=ca.cert_pem, cert_pem=worker.cert_pem, key_pem=worker.key_pem), "prefill-0")
            try:
                assert await agent.start()
                report = registry_pb2.ReportLoadRequest(worker_id="prefill-0", lease_id=7, report_seq=1)
                assert await agent.publish_load(report, token)
                assert (await asyncio.wait_for(messages.get(), 10)).kind == "load"
                for seq in (1, 2):  # the second snapshot purges the first (a purge above sequence 1)
                    batch = registry_pb2.PublishKVEventsRequest(worker_id="prefill-0", lease_id=7, seq=seq, snapshot=True)
                    assert await agent.publish_kv(batch, token)  # acknowledged on the agents' inbox
                    assert (await asyncio.wait_for(messages.get(), 10)).kind == "kv"
                deadline = time.monotonic() + 10
                while (await replica._js.stream_info(wire.KV_STREAM)).state.messages != 1:  # the purge went through
                    assert time.monotonic() < deadline, "the agent's purge before its snapshot was not allowed"
                    await asyncio.sleep(0.1)
                # A keep-alive on the bus: the agent may publish it, and a replica's answer reaches its inbox.
                lease = await store.lease_grant(10)
                request = registry_pb2.KeepAliveRequest(worker_id="prefill-0", lease_id=lease, keepalive_seq=1)
                reply = await agent.keep_alive(request, secrets.session_token("prefill-0", lease), 10.0)
                assert reply is not None and reply.ttl_seconds == 10
            finally:
                await agent.close()
                await keepalives.close()

            # The same certificate, anything else: NATS answers each with a permissions violation.
            violations: list[str] = []

            async def on_error(e: Exception) -> None:
                violations.append(str(e))

            nosy = Client()
            await nosy.connect(servers=[pair.url], tls=pair.tls(*certs.write_pair(tmp_path, "nosy", worker)), error_cb=on_error,
                               allow_reconnect=False)  # fmt: skip
            try:
                await nosy.subscribe("kvplane.>")  # every worker's reports and batches
                await nosy.subscribe("_INBOX.>")  # what the replicas' consumers are sent
                await nosy.publish(f"$JS.API.STREAM.DELETE.{wire.KV_STREAM}", b"")
                await nosy.flush()
                deadline = time.monotonic() + 10
                while len(violations) < 3:
                    assert time.monotonic() < deadline, violations
                    await asyncio.sleep(0.1)
            finally:
                await nosy.close()
            # (nats-py writes the server's -ERR in lower case.)
            assert sorted(v.lower() for v in violations) == [
                'nats: permissions violation for publish to "$js.api.stream.delete.kvplane_kv"',
                'nats: permissions violation for subscription to "_inbox.>"',
                'nats: permissions violation for subscription to "kvplane.>"',
            ]
            assert (await replica._js.stream_info(wire.KV_STREAM)).state.messages == 1  # not deleted
            await replica.close()
            with pytest.raises(BusUnavailable, match="refused"):
                await NatsBus(pair.url, tls=pair.tls(*certs.write_pair(tmp_path, "other", other)), timeout_s=1.0).start()

        asyncio.run(body())


def test_an_agent_publishes_its_reports_and_batches_over_tls_with_its_own_certificate(tmp_path):
    """--bus-for-agents tls://...: the agent dials NATS with its own certificate and the cluster's
    CA (dataplane/agent/bus_publish.py), its report and its KV batch arrive without the session
    token and with their MACs; without a client certificate NATS refuses it and the agent says it cannot publish."""
    from kvplane import bus as wire
    from kvplane.dataplane.agent.bus_publish import BusPublisher
    from kvplane.security.credentials import Credentials

    ca = certs.create_ca()
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    server_cert, server_key = certs.write_pair(tmp_path, "nats", certs.issue_server(ca, "nats", ("127.0.0.1",)))
    cp_cert, cp_key = certs.write_pair(tmp_path, "cp", certs.issue(ca, Identity(Role.CONTROLPLANE, "controlplane")))
    worker = certs.issue(ca, Identity(Role.WORKER, "w.1"))
    tls_args = ("--tls", "--tlscert", str(server_cert), "--tlskey", str(server_key), "--tlscacert", str(ca_file), "--tlsverify")
    server = start_nats(tmp_path / "nats", extra_args=tls_args)
    token = b"t" * 32
    try:
        replica_tls = ControlPlaneConfig(bus=server.url, bus_ca=str(ca_file), bus_cert=str(cp_cert), bus_key=str(cp_key)).validate().bus_tls

        async def body():
            bus = NatsBus(server.url, tls=replica_tls)
            await bus.start()
            messages = await bus_messages(bus)
            direct = BusPublisher(server.url, Credentials(ca_pem=ca.cert_pem, cert_pem=worker.cert_pem, key_pem=worker.key_pem), "w.1")
            try:
                assert await direct.start()
                report = registry_pb2.ReportLoadRequest(worker_id="w.1", lease_id=7, report_seq=1, session_token=token)
                assert await direct.publish_load(report, token)
                message = await asyncio.wait_for(messages.get(), 10)
                assert message.kind == "load" and wire.mac_valid(token, "load", message.payload, message.mac)
                sent = registry_pb2.ReportLoadRequest.FromString(message.payload)
                assert (sent.worker_id, sent.report_seq, sent.session_token) == ("w.1", 1, b"")
                batch = registry_pb2.PublishKVEventsRequest(worker_id="w.1", lease_id=7, seq=1, snapshot=True, session_token=token)
                assert await direct.publish_kv(batch, token)  # the stream acknowledged it
                message = await asyncio.wait_for(messages.get(), 10)
                assert message.kind == "kv" and wire.mac_valid(token, "kv", message.payload, message.mac)
                assert registry_pb2.PublishKVEventsRequest.FromString(message.payload).session_token == b""
            finally:
                await direct.close()
                await bus.close()
            without = BusPublisher(server.url, Credentials(ca_pem=ca.cert_pem), "w.2")  # the CA alone: no client certificate
            assert not await without.start()

        asyncio.run(body())
    finally:
        server.stop()
