"""Certificates rotated on disk under traffic (kvplane.security.reload), over real mutual TLS on
loopback: no call fails, a half-written rotation is never served, and once the new files are in
place new connections use the new chain both ways (the server presents it, channels present it)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from cryptography import x509

from kvplane.grpc_util import add_port, aio_channel, make_server
from kvplane.security import certs, reload
from kvplane.security.credentials import Credentials
from kvplane.security.identity import Identity, Role

SERVER = Identity(Role.CONTROLPLANE, "controlplane")
CLIENT = Identity(Role.ADMIN, "rotator")
METHOD = "/kvplane.test.Rotation/Issuer"


def _issuer_cn(pem: bytes) -> str:
    return x509.load_pem_x509_certificate(pem).issuer.rfc4514_string()


def _handler(seen: list[str]) -> grpc.GenericRpcHandler:
    async def issuer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        # Which CA signed the certificate the caller's connection presented.
        cert = context.auth_context()["x509_pem_cert"][0]
        seen.append(_issuer_cn(cert))
        return seen[-1].encode()

    rpc = grpc.unary_unary_rpc_method_handler(issuer)
    return grpc.method_handlers_generic_handler("kvplane.test.Rotation", {"Issuer": rpc})


def _write(directory, stem: str, pair: certs.KeyPair, ca_pems: list[bytes], *, pause_between: float = 0.0) -> None:
    """Writes STEM's CA bundle, certificate, then key (the key after `pause_between`: a rotation
    caught half-way by a reload check)."""
    (directory / f"{stem}-ca.pem").write_bytes(b"".join(ca_pems))
    (directory / f"{stem}.pem").write_bytes(pair.cert_pem)
    time.sleep(pause_between)
    (directory / f"{stem}.key").write_bytes(pair.key_pem)


def _files(directory, stem: str) -> Credentials:
    return Credentials.from_files(directory / f"{stem}.pem", directory / f"{stem}.key", directory / f"{stem}-ca.pem", source="test")


async def _call(channel: grpc.aio.Channel) -> str:
    return (await channel.unary_unary(METHOD)(b"", timeout=10)).decode()


async def _static_call(port: int, ca: certs.KeyPair, client: certs.KeyPair) -> str:
    credentials = Credentials(ca.cert_pem, client.cert_pem, client.key_pem, source="fresh")
    async with aio_channel(f"localhost:{port}", credentials, traced=False) as channel:
        return await _call(channel)


def test_rotation_under_traffic_fails_no_call_and_new_connections_use_the_new_chain(tmp_path):
    asyncio.run(_rotation(tmp_path))


async def _rotation(tmp_path) -> None:
    old_ca, new_ca = certs.create_ca("old CA"), certs.create_ca("new CA")
    _write(tmp_path, "server", certs.issue(old_ca, SERVER), [old_ca.cert_pem])
    _write(tmp_path, "client", certs.issue(old_ca, CLIENT), [old_ca.cert_pem])
    server_credentials, client_credentials = _files(tmp_path, "server"), _files(tmp_path, "client")
    assert server_credentials.files is not None and client_credentials.files is not None

    seen: list[str] = []
    server = make_server()
    server.add_generic_rpc_handlers((_handler(seen),))
    port = add_port(server, "localhost:0", server_credentials)
    await server.start()
    channel = aio_channel(f"localhost:{port}", client_credentials, traced=False)
    assert isinstance(channel, reload.RenewingChannel)
    failures: list[BaseException] = []
    calls = 0
    stop = asyncio.Event()

    async def traffic() -> None:
        nonlocal calls
        while not stop.is_set():
            try:
                await _call(channel)
                calls += 1
            except grpc.RpcError as e:
                failures.append(e)
            await asyncio.sleep(0.005)

    workers = [asyncio.create_task(traffic()) for _ in range(4)]
    try:
        await asyncio.sleep(0.5)
        assert set(seen) == {_issuer_cn(old_ca.cert_pem)}
        # 1. Both sides trust both CAs (cert-manager's trust bundle during a CA rotation).
        both = [old_ca.cert_pem, new_ca.cert_pem]
        await asyncio.to_thread(_write, tmp_path, "server", certs.issue(old_ca, SERVER), both)
        await asyncio.to_thread(_write, tmp_path, "client", certs.issue(old_ca, CLIENT), both)
        await asyncio.sleep(reload.CHECK_INTERVAL_S * 1.5)
        # 2. New leaves from the new CA; the server's key lands 1.5 checks after its certificate.
        await asyncio.to_thread(_write, tmp_path, "server", certs.issue(new_ca, SERVER), both, pause_between=reload.CHECK_INTERVAL_S * 1.5)
        await asyncio.to_thread(_write, tmp_path, "client", certs.issue(new_ca, CLIENT), both)
        await asyncio.sleep(reload.CHECK_INTERVAL_S * 1.5)
        # 3. The old CA is trusted no more.
        await asyncio.to_thread(_write, tmp_path, "server", certs.issue(new_ca, SERVER), [new_ca.cert_pem])
        await asyncio.to_thread(_write, tmp_path, "client", certs.issue(new_ca, CLIENT), [new_ca.cert_pem])
        await asyncio.sleep(reload.CHECK_INTERVAL_S * 1.5)
        count_before = len(seen)
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        await asyncio.gather(*workers)

    try:
        assert failures == [], failures[:3]
        assert calls > 100
        # The renewing channel's latest calls came over connections with the new client certificate.
        assert set(seen[count_before:]) == {_issuer_cn(new_ca.cert_pem)}
        assert channel.current() is not None and client_credentials.files.current().generation == 3
        # A fresh connection trusting only the new CA is served by the new chain; one that trusts
        # only the old CA, or presents an old-CA certificate, is refused at the handshake.
        assert await _static_call(port, new_ca, certs.issue(new_ca, CLIENT)) == _issuer_cn(new_ca.cert_pem)
        for ca, client in ((old_ca, certs.issue(old_ca, CLIENT)), (new_ca, certs.issue(old_ca, CLIENT))):
            with pytest.raises(grpc.RpcError) as refused:
                await _static_call(port, ca, client)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await channel.close()
        await server.stop(None)


def test_a_half_written_or_broken_rotation_is_not_adopted(tmp_path):
    ca = certs.create_ca("ca")
    _write(tmp_path, "server", certs.issue(ca, SERVER), [ca.cert_pem])
    clock = [0.0]
    files = reload.CertificateFiles(tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "server-ca.pem", clock=lambda: clock[0])
    first = files.current()
    renewed = certs.issue(ca, SERVER)
    (tmp_path / "server.pem").write_bytes(renewed.cert_pem)  # the key still the old one
    clock[0] += reload.CHECK_INTERVAL_S
    assert files.current() == first
    (tmp_path / "server.key").write_bytes(b"-----BEGIN PRIVATE KEY-----\ntruncated")
    clock[0] += reload.CHECK_INTERVAL_S
    assert files.current() == first
    (tmp_path / "server.key").write_bytes(renewed.key_pem)
    assert files.current() == first  # checked at most once per interval
    clock[0] += reload.CHECK_INTERVAL_S
    now = files.current()
    assert (now.cert_pem, now.key_pem, now.generation) == (renewed.cert_pem, renewed.key_pem, 1)
    with pytest.raises(reload.MaterialError, match="does not belong"):
        reload.check_material(renewed.cert_pem, first.key_pem, ca.cert_pem)
