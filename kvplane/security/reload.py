"""Certificates and keys reloaded from disk when they change: no restart when cert-manager renews.

Rule: a process that was given --tls-cert/--tls-key/--tls-ca FILES keeps watching them. A check
(at most every CHECK_INTERVAL_S, on the next handshake or call) stats the three files (size, mtime,
inode, so the symlink swap of a Kubernetes Secret or CSI volume counts); when they changed it reads
them, and adopts the new material only if it is whole: the CA and the certificate parse and the key
belongs to the certificate. A half-written rotation (certificate written, key not yet) is skipped
until the next check, so a reader never serves a mismatched pair and no handshake fails because of it.

Where the new material is used:
- servers: `server_credentials()` is gRPC's dynamic SSL server credentials, whose fetcher runs
  before every handshake, so each new connection gets the current certificate and CA;
- grpc.aio channels: gRPC has no dynamic channel credentials, so `RenewingChannel` makes a new
  channel for calls started after a change, and closes the old one once its calls are done
  (OLD_CHANNEL_GRACE_S at most). Blocking channels (the SDK's, the CLI's) read the files when they
  are made.
Connections already open are untouched: TLS checks certificates at the handshake only, and
cert-manager renews well before expiry (at 2/3 of the lifetime by default).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
OLD_CHANNEL_GRACE_S = 600.0  # a KV stream or a long generation on the old channel may finish


@dataclass(frozen=True, slots=True)
class Material:
    """One consistent set of PEM files and the generation that counts changes (0 = as started)."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    generation: int


class MaterialError(ValueError):
    """The files on disk are not (yet) a usable certificate, key and CA."""


def check_material(cert_pem: bytes, key_pem: bytes, ca_pem: bytes) -> None:
    """Raises MaterialError unless the CA and certificate parse and the key is the certificate's."""
    from cryptography import x509  # noqa: PLC0415 (loaded only by processes that use TLS)
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        x509.load_pem_x509_certificates(ca_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as e:
        raise MaterialError(f"not a PEM certificate, key and CA ({e})") from None
    raw = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*raw) != key.public_key().public_bytes(*raw):
        raise MaterialError("the private key does not belong to the certificate (a rotation half written?)")


class CertificateFiles:
    """The certificate, key and CA files of one process, re-read when they change."""

    def __init__(self, cert: str | os.PathLike, key: str | os.PathLike, ca: str | os.PathLike, *, clock=time.monotonic) -> None:
        self.paths = (Path(cert), Path(key), Path(ca))
        self._clock = clock
        self._lock = threading.Lock()  # the server's fetcher runs on gRPC's threads
        self._signature = self._stat()
        cert_pem, key_pem, ca_pem = (p.read_bytes() for p in self.paths)
        check_material(cert_pem, key_pem, ca_pem)
        self._material = Material(cert_pem, key_pem, ca_pem, 0)
        self._checked_at = clock()

    def _stat(self) -> tuple:
        signature = []
        for path in self.paths:
            st = path.stat()  # follows symlinks: a Secret volume's ..data swap changes the inode
            signature.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(signature)

    def current(self) -> Material:
        """The newest whole material (checking the files at most every CHECK_INTERVAL_S)."""
        now = self._clock()
        if now - self._checked_at < CHECK_INTERVAL_S:
            return self._material
        with self._lock:
            if now - self._checked_at >= CHECK_INTERVAL_S:
                self._checked_at = now
                self._reload()
            return self._material

    def _reload(self) -> None:
        try:
            signature = self._stat()
            if signature == self._signature:
                return
            cert_pem, key_pem, ca_pem = (p.read_bytes() for p in self.paths)
            check_material(cert_pem, key_pem, ca_pem)
        except (OSError, MaterialError) as e:
            log.warning("TLS files changed but are not usable yet, keeping the current ones: %s", e)
            return  # signature not taken: checked again next time
        self._signature = signature
        old = self._material
        if (cert_pem, key_pem, ca_pem) != (old.cert_pem, old.key_pem, old.ca_pem):
            self._material = Material(cert_pem, key_pem, ca_pem, old.generation + 1)
            log.info("TLS certificate, key and CA reloaded from %s (generation %d)", self.paths[0].parent, old.generation + 1)


def server_credentials(files: CertificateFiles) -> grpc.ServerCredentials:
    """mTLS server credentials that take the current files at every new connection's handshake."""
    first = files.current()
    served = [first.generation]

    def configuration(m: Material) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(m.key_pem, m.cert_pem)], root_certificates=m.ca_pem)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        material = files.current()
        if material.generation == served[0]:
            return None  # unchanged: gRPC keeps what it has
        served[0] = material.generation
        return configuration(material)

    return grpc.dynamic_ssl_server_credentials(configuration(first), fetch, require_client_authentication=True)


class _Method:
    """A multicallable of a RenewingChannel: each call goes to the channel current at its start."""

    def __init__(self, owner: RenewingChannel, kind: str, args: tuple, kwargs: dict) -> None:
        self._owner, self._kind, self._args, self._kwargs = owner, kind, args, kwargs
        self._made: tuple[object, object] | None = None  # (inner channel, its multicallable)

    def __call__(self, *args, **kwargs):
        inner = self._owner.current()
        made = self._made
        if made is None or made[0] is not inner:
            made = self._made = (inner, getattr(inner, self._kind)(*self._args, **self._kwargs))
        return made[1](*args, **kwargs)


class RenewingChannel(grpc.aio.Channel):
    """A grpc.aio channel whose credentials follow CertificateFiles: `make(material)` builds the
    real channel, again after each change; stubs made on this object keep working throughout."""

    def __init__(self, files: CertificateFiles, make) -> None:
        self._files = files
        self._make = make
        material = files.current()
        self._generation = material.generation
        self._inner: grpc.aio.Channel = make(material)
        self._old: list[grpc.aio.Channel] = []

    def current(self) -> grpc.aio.Channel:
        material = self._files.current()
        if material.generation != self._generation:
            old, self._generation = self._inner, material.generation
            self._inner = self._make(material)
            self._old.append(old)
            # Calls in flight finish on the old channel; close() lets it go after them.
            asyncio.get_running_loop().create_task(self._retire(old), name="close-old-channel")
        return self._inner

    async def _retire(self, old: grpc.aio.Channel) -> None:
        await old.close(grace=OLD_CHANNEL_GRACE_S)
        if old in self._old:
            self._old.remove(old)

    def unary_unary(self, *args, **kwargs):
        return _Method(self, "unary_unary", args, kwargs)

    def unary_stream(self, *args, **kwargs):
        return _Method(self, "unary_stream", args, kwargs)

    def stream_unary(self, *args, **kwargs):
        return _Method(self, "stream_unary", args, kwargs)

    def stream_stream(self, *args, **kwargs):
        return _Method(self, "stream_stream", args, kwargs)

    def get_state(self, try_to_connect: bool = False):
        return self._inner.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state) -> None:
        await self._inner.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self.current().channel_ready()

    async def close(self, grace: float | None = None) -> None:
        await asyncio.gather(*(c.close(grace) for c in [*self._old, self._inner]))

    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, exc_val, exc_tb) -> None:
        await self.close(None)
