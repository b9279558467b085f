"""Runs the HTTP face inside the control-plane process, on its event loop, next to gRPC.

Security: the face calls this process's own gRPC server with the replica's credentials and the
caller's `Authorization: Bearer` header as metadata, so the gRPC AuthInterceptor decides: a known
token is its identity (its tenant, its rate limit); with no token the call is the control plane's
own identity, which may list workers (/v1/models, /health) but not generate. On a plaintext
(--insecure) control plane, callers without a token are the anonymous client. The listener
serves HTTPS with the replica's certificate whenever the replica runs TLS (callers trust the
cluster CA; no client certificate is asked for: the bearer token is the HTTP identity), and plain
HTTP only on an --insecure control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

import uvicorn

from kvplane.controlplane.http.app import make_app
from kvplane.controlplane.http.guard import BodyLimits
from kvplane.grpc_util import aio_channel
from kvplane.security.auth import Authenticator
from kvplane.security.credentials import Credentials
from kvplane.v1 import client_pb2_grpc

log = logging.getLogger(__name__)


def loopback_address(host: str, port: int) -> str:
    """Where this process's own gRPC server answers: its listen address, or loopback for a wildcard."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class HttpFace:
    """`authenticator`: the gRPC server's, so that a request is refused (401) on its headers,
    before its body is read; `body_limits`: how large a body may be and how long it may take."""

    def __init__(
        self, grpc_address: str, host: str, port: int, credentials: Credentials, *,
        authenticator: Authenticator | None = None, body_limits: BodyLimits | None = None,
    ) -> None:  # fmt: skip
        self._channel = aio_channel(grpc_address, credentials)
        stub = client_pb2_grpc.KvplaneStub(self._channel)
        app = make_app(lambda: stub, _prometheus_text, authenticator, body_limits)
        self._tls_dir: Path | None = None
        tls: dict = {}
        if credentials.tls:
            # uvicorn reads its certificate from files: a private copy, removed on stop.
            self._tls_dir = Path(tempfile.mkdtemp(prefix="kvplane-https-"))
            tls = {"ssl_certfile": str(_private(self._tls_dir / "cert.pem", credentials.cert_pem)),
                   "ssl_keyfile": str(_private(self._tls_dir / "key.pem", credentials.key_pem))}  # fmt: skip
        self.scheme = "https" if tls else "http"
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off", **tls)
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task | None = None
        self.port: int | None = None

    async def start(self) -> int:
        self._task = asyncio.create_task(self._server.serve(), name="http-face")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start (port in use, ...)
                raise RuntimeError("the HTTP server stopped before it started")
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._task is not None:
            self._server.should_exit = True
            try:
                await asyncio.wait_for(self._task, 5)
            except (TimeoutError, Exception) as e:  # shutting down: log, do not raise
                log.warning("HTTP server did not stop cleanly: %s", e)
        await self._channel.close()
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)


def _private(path: Path, data: bytes | None) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data or b"")
    return path


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: the control plane owns SIGINT/SIGTERM and stops it."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def _prometheus_text() -> bytes:
    import prometheus_client

    return prometheus_client.generate_latest(prometheus_client.REGISTRY)
