"""Plaintext liveness and readiness for the kubelet, on the metrics port: /healthz and /readyz.

Under mutual TLS the kubelet's gRPC probes cannot present a client certificate, and a `tcpSocket`
probe only says that the port accepts. So every server's Prometheus endpoint also answers:

- `/readyz`: 200 while every gRPC server of the process reports SERVING on grpc.health.v1, else
  503. It mirrors `kvplane.grpc_util.set_serving`, the one place servers change their health:
  503 before the server is up and from SIGTERM on (an agent's drain), exactly the NOT_SERVING a
  gRPC health check would see.
- `/healthz`: 200 while the event loop is alive: a heartbeat task ticks every HEARTBEAT_S once the
  first server is up, and a beat older than STALL_S (a wedged or starved loop: gRPC could not
  answer either) makes it 503, so the kubelet restarts the container. Before the first server is
  up (an engine loading for minutes) it is 200: that is the startup probe's business.

Both answer only a status word, never a detail an unauthenticated caller should not read. The
metrics themselves are served as prometheus_client serves them (same registry, same encodings).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

HEARTBEAT_S = 1.0
STALL_S = 30.0  # well above any pause a busy event loop takes, well below a kubelet's patience
HEALTHZ, READYZ = "/healthz", "/readyz"


class Probes:
    """What /healthz and /readyz answer, for one process (the servers in it report here)."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._serving: dict[int, bool] = {}  # one entry per gRPC health servicer
        self._beat_at: float | None = None
        self._heartbeat: asyncio.Task | None = None

    def set_serving(self, server: object, serving: bool) -> None:
        """`server` (its health servicer) now reports SERVING or NOT_SERVING; in an event loop this
        also starts the heartbeat that /healthz reads."""
        with self._lock:
            self._serving[id(server)] = serving
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._heartbeat is None or self._heartbeat.done() or self._heartbeat.get_loop() is not loop:
            self._beat_at = self._clock()
            self._heartbeat = loop.create_task(self._beat(), name="liveness-heartbeat")

    async def _beat(self) -> None:
        while True:
            self._beat_at = self._clock()
            await asyncio.sleep(HEARTBEAT_S)

    def readiness(self) -> tuple[bool, str]:
        with self._lock:
            states = list(self._serving.values())
        if not states:
            return False, "starting"
        return (True, "ready") if all(states) else (False, "not serving")

    def liveness(self) -> tuple[bool, str]:
        beat = self._beat_at
        if beat is None:
            return True, "alive"
        stalled = self._clock() - beat
        return (True, "alive") if stalled < STALL_S else (False, f"event loop stalled for {stalled:.0f}s")


probes = Probes()


def wsgi_app(metrics_app, state: Probes = probes):
    """/healthz and /readyz from `state`; every other path to `metrics_app` (/metrics)."""

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path not in (HEALTHZ, READYZ):
            return metrics_app(environ, start_response)
        ok, word = state.liveness() if path == HEALTHZ else state.readiness()
        body = f"{word}\n".encode()
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds the process up on exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        pass  # a probe every few seconds is not worth a log line


def start_http_server(port: int, addr: str, state: Probes = probes) -> WSGIServer:
    """Serves /metrics (the default prometheus_client registry), /healthz and /readyz on ADDR:PORT
    in a daemon thread; returns the server (its `server_port`, `shutdown()`)."""
    from prometheus_client import make_wsgi_app

    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("ProbeServer", (_Server,), {"address_family": family})
    server = make_server(addr, port, wsgi_app(make_wsgi_app(), state), server_class, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
