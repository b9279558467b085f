"""A real control plane (memory store, HTTP face on) in this process, on its own event loop in a
thread, with a probe on that loop that records how late its timers fire (the loop's stall)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvplane.controlplane.config import ControlPlaneConfig
from kvplane.controlplane.server import ControlPlane, ControlPlaneSecurity
from kvplane.security.auth import TokenTable
from kvplane.security.credentials import Credentials
from kvplane.security.identity import Identity, Role

TOKEN = "tenant-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
PROBE_INTERVAL_S = 0.01


@dataclass
class RunningPlane:
    plane: ControlPlane
    loop: asyncio.AbstractEventLoop
    max_stall_s: list[float] = field(default_factory=lambda: [0.0])

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.plane.port}"

    @property
    def http_port(self) -> int:
        assert self.plane.http_port is not None
        return self.plane.http_port

    def reset_stall(self) -> None:
        self.max_stall_s[0] = 0.0


@contextlib.contextmanager
def control_plane(*, allow_anonymous: bool = False, **config) -> Iterator[RunningPlane]:
    """A plaintext replica that knows TOKEN (a client of tenant "t1") and ADMIN_TOKEN; callers without a token are
    refused unless `allow_anonymous`."""
    tokens = TokenTable()
    tokens.add(TOKEN, Identity(Role.CLIENT, "app", "t1"))
    tokens.add(ADMIN_TOKEN, Identity(Role.ADMIN, "ops"))
    security = ControlPlaneSecurity(Credentials.plaintext(source="test"), tokens, allow_anonymous=allow_anonymous)
    plane = ControlPlane(ControlPlaneConfig(**{"port": 0, "http_port": 0, **config}), security)
    loop = asyncio.new_event_loop()
    running = RunningPlane(plane, loop)
    started = threading.Event()
    stop = asyncio.Event()

    async def probe() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(PROBE_INTERVAL_S)
            running.max_stall_s[0] = max(running.max_stall_s[0], time.monotonic() - before - PROBE_INTERVAL_S)

    async def main() -> None:
        await plane.start()
        task = asyncio.create_task(probe())
        started.set()
        await stop.wait()
        task.cancel()
        await plane.stop(0)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(30), "the control plane did not start"
    try:
        yield running
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


def rss_bytes() -> int:
    """This process's resident memory now."""
    match = re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text())
    assert match
    return int(match.group(1)) * 1024


def read_status(sock: socket.socket, timeout: float = 30.0) -> tuple[int, bytes]:
    """The HTTP status and whatever of the answer arrived (until the server closed the connection)."""
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(ConnectionError, TimeoutError):
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and _complete(data):
                break
    match = re.match(rb"HTTP/1\.1 (\d{3})", data)
    assert match, f"no HTTP answer, got {data[:200]!r}"
    return int(match.group(1)), data


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: (\d+)", head)
    return length is not None and len(body) >= int(length.group(1))
