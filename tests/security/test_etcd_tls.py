"""etcd's own transport security and auth: the control plane reaches a TLS etcd with client-certificate
auth (its certificate's CN is the etcd user, allowed only /kvplane/), and nobody else can read the
ticket-signing key there."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from aetcd import rpc

from kvplane.apps.cluster import LocalCluster
from kvplane.controlplane.store import StoreError, open_store
from kvplane.security import certs
from kvplane.security.credentials import Credentials

pytestmark = pytest.mark.cluster


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _files(directory: Path, stem: str, pair: certs.KeyPair) -> tuple[str, str]:
    cert, key = certs.write_pair(directory, stem, pair)
    return str(cert), str(key)


async def _setup_auth(endpoint: str, root: Credentials) -> None:
    """Users root (required to enable auth) and controlplane (read/write on /kvplane/ only); auth on."""
    store = open_store(f"etcd://{endpoint}", tls=root)
    await store.get("/probe")  # connects
    auth = rpc.AuthStub(store._clients[0].channel)  # the only member
    await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password="unused-root-password"))
    await auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"))
    await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"))
    await auth.UserAdd(rpc.AuthUserAddRequest(name="controlplane", password="unused-password"))
    await auth.RoleAdd(rpc.AuthRoleAddRequest(name="kvplane"))
    permission = rpc.Permission(permType=rpc.Permission.READWRITE, key=b"/kvplane/", range_end=b"/kvplane0")
    await auth.RoleGrantPermission(rpc.AuthRoleGrantPermissionRequest(name="kvplane", perm=permission))
    await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="controlplane", role="kvplane"))
    await auth.AuthEnable(rpc.AuthEnableRequest())
    await store.close()


async def _read(endpoint: str, credentials: Credentials | None, key: str) -> bytes | None:
    store = open_store(f"etcd://{endpoint}", tls=credentials)
    try:
        kv = await asyncio.wait_for(store.get(key), 10)
        return kv.value if kv else None
    finally:
        await store.close()


def test_the_control_plane_uses_etcds_tls_and_auth_and_others_cannot_read_its_secrets(tmp_path):
    binary = shutil.which("etcd")
    if binary is None:
        pytest.fail("etcd is not on PATH; run `make test`, which installs it")
    ca = certs.create_ca("etcd test CA")
    ca_path = tmp_path / "ca.pem"
    ca_path.write_bytes(ca.cert_pem)
    server_cert, server_key = _files(tmp_path, "etcd-server", certs.issue_server(ca, "etcd"))
    cp_cert, cp_key = _files(tmp_path, "controlplane", certs.issue_server(ca, "controlplane"))
    client_port, peer_port = _free_port(), _free_port()
    endpoint = f"127.0.0.1:{client_port}"
    args = [
        binary, "--name", "s", "--data-dir", str(tmp_path / "data"),
        "--listen-client-urls", f"https://{endpoint}", "--advertise-client-urls", f"https://{endpoint}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer_port}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
        "--initial-cluster", f"s=http://127.0.0.1:{peer_port}", "--heartbeat-interval", "25", "--election-timeout", "250",
        "--cert-file", server_cert, "--key-file", server_key, "--trusted-ca-file", str(ca_path), "--client-cert-auth",
    ]  # fmt: skip
    with open(tmp_path / "etcd.log", "ab") as log:
        etcd = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    root = Credentials(ca.cert_pem, *_pair(certs.issue_server(ca, "root")))
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                asyncio.run(_read(endpoint, root, "/probe"))
                break
            except StoreError:
                assert time.monotonic() < deadline, (tmp_path / "etcd.log").read_text()[-2000:]
                time.sleep(0.2)
        asyncio.run(_setup_auth(endpoint, root))
        etcd_args = ("--etcd-ca", str(ca_path), "--etcd-cert", cp_cert, "--etcd-key", cp_key)
        with LocalCluster(
            num_prefill=0, num_decode=1, store=f"etcd://{endpoint}", controlplane_args=etcd_args, log_dir=tmp_path / "logs"
        ) as cluster:
            with cluster.client(timeout=60) as client:
                assert len(client.generate([1, 2, 3, 4], max_tokens=2).token_ids) == 2
            signing_key = asyncio.run(
                _read(
                    endpoint,
                    Credentials(ca.cert_pem, *_pair(certs.read_pair(tmp_path, "controlplane"))),
                    "/kvplane/config/ticket_signing_key",
                )
            )
            assert signing_key is not None and len(signing_key) == 32
            # Plaintext, no client certificate, or a certificate of a user etcd does not know: nothing.
            with pytest.raises(StoreError):
                asyncio.run(_read(endpoint, None, "/kvplane/config/ticket_signing_key"))
            with pytest.raises(StoreError):
                asyncio.run(_read(endpoint, Credentials(ca_pem=ca.cert_pem), "/kvplane/config/ticket_signing_key"))
            with pytest.raises(StoreError):
                mallory = Credentials(ca.cert_pem, *_pair(certs.issue_server(ca, "mallory")))
                asyncio.run(_read(endpoint, mallory, "/kvplane/config/ticket_signing_key"))
    finally:
        etcd.terminate()
        etcd.wait(timeout=10)


def _pair(pair: certs.KeyPair) -> tuple[bytes, bytes]:
    return pair.cert_pem, pair.key_pem
