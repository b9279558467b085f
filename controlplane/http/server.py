"""Runs the HTTP face inside the control-plane process, on its event loop, next to gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import uvicorn

from controlplane.http.app import make_app
from kvplane.grpc_util import aio_channel
from kvplane.v1 import client_pb2_grpc

log = logging.getLogger(__name__)


def loopback_address(host: str, port: int) -> str:
    """Where this process's own gRPC server answers: its listen address, or loopback for a wildcard."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class HttpFace:
    def __init__(self, grpc_address: str, host: str, port: int) -> None:
        self._channel = aio_channel(grpc_address)
        stub = client_pb2_grpc.KvplaneStub(self._channel)
        app = make_app(lambda: stub, _prometheus_text)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
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


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: the control plane owns SIGINT/SIGTERM and stops it."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def _prometheus_text() -> bytes:
    import prometheus_client

    return prometheus_client.generate_latest(prometheus_client.REGISTRY)
