"""Shared test fixtures: a real etcd server on loopback.

`etcd_endpoint` (session-scoped) is one etcd for the whole run; tests sharing it must use their
own key prefix. `etcd_factory` starts fresh servers for tests that stop, kill or restart etcd.
`start_etcd(tmp_dir)` is the plain function behind both.

The server runs with a 25 ms heartbeat and a 250 ms election timeout: a single member elects
itself in ~0.3 s, and etcd's minimum lease TTL (1.5 x election timeout, rounded up) drops from
2 s to 1 s, so lease tests can use ttl=1.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ETCD_MISSING = (
    "the etcd binary was not found on PATH; run `make test` (it installs etcd-server), or install etcd 3.4+ yourself and put it on PATH"
)


@pytest.fixture(autouse=True)
def _processes_need_the_cluster_marker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A test that starts a process must carry @pytest.mark.cluster, so that `-m "not cluster"`
    stays the fast, process-free suite: outside the marker, starting one fails the test."""
    if request.node.get_closest_marker("cluster") is None:

        def refuse(*args, **kwargs):
            raise RuntimeError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.cluster")

        monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
        monkeypatch.setattr(os, "fork", refuse)
    yield


@pytest.fixture(autouse=True, scope="session")
def _kvplane_home(tmp_path_factory: pytest.TempPathFactory):
    """Local clusters publish their client credentials under $KVPLANE_HOME: a temporary one for the
    run, so tests never touch ~/.kvplane (children and CLI subprocesses inherit it)."""
    previous = os.environ.get("KVPLANE_HOME")
    os.environ["KVPLANE_HOME"] = str(tmp_path_factory.mktemp("kvplane-home"))
    yield
    if previous is None:
        os.environ.pop("KVPLANE_HOME", None)
    else:
        os.environ["KVPLANE_HOME"] = previous


class EtcdNotFound(RuntimeError):
    pass


@dataclass(slots=True)
class EtcdServer:
    process: subprocess.Popen
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        """The store URL for open_store()."""
        return f"etcd://{self.endpoint}"

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM, then SIGKILL after 5 s). Idempotent."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """Crash it (SIGKILL). The data dir survives, so restart() brings the same data back."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self, timeout_s: float = 15.0) -> None:
        """Stop it if running, then start it again on the same ports with the same data."""
        self.stop()
        again = start_etcd(self.data_dir.parent, self.client_port, self.peer_port, timeout_s)
        self.process = again.process


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log_tail(path: Path, num_lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except OSError:
        return "(no log)"


def _launch(binary: str, tmp_dir: Path, client_port: int, peer_port: int) -> EtcdServer:
    client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    data_dir, log_path = tmp_dir / "data", tmp_dir / "etcd.log"
    args = [
        binary, "--name", "t", "--data-dir", str(data_dir),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"t={peer_url}",
        "--heartbeat-interval", "25", "--election-timeout", "250",
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return EtcdServer(process, client_port, peer_port, data_dir, log_path)


def _wait_healthy(server: EtcdServer, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://{server.endpoint}/health", timeout=0.5) as response:
                if b'"true"' in response.read():
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def start_etcd(tmp_dir: Path | str, client_port: int | None = None, peer_port: int | None = None, timeout_s: float = 15.0) -> EtcdServer:
    """Start etcd with its data and log under tmp_dir; return once it answers /health.

    Ports default to free loopback ports (retried if another process grabs one first); pass the
    ports and tmp_dir of a stopped server to restart it with its data.
    """
    binary = shutil.which("etcd")
    if binary is None:
        raise EtcdNotFound(ETCD_MISSING)
    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    num_attempts = 1 if client_port is not None else 3
    for _ in range(num_attempts):
        server = _launch(binary, tmp_dir, client_port or _free_port(), peer_port or _free_port())
        if _wait_healthy(server, timeout_s):
            return server
        server.kill()
    raise RuntimeError(f"etcd did not become healthy at {server.endpoint}; log tail:\n{_log_tail(server.log_path)}")


def _start_or_fail(tmp_dir: Path) -> EtcdServer:
    try:
        return start_etcd(tmp_dir)
    except EtcdNotFound as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def etcd_endpoint(tmp_path_factory: pytest.TempPathFactory):
    """ "127.0.0.1:PORT" of one etcd shared by the whole test session."""
    server = _start_or_fail(tmp_path_factory.mktemp("etcd"))
    yield server.endpoint
    server.stop()


@pytest.fixture
def etcd_factory(tmp_path_factory: pytest.TempPathFactory):
    """Call it to start a fresh etcd (an EtcdServer); every server it started is stopped afterwards."""
    servers: list[EtcdServer] = []

    def start() -> EtcdServer:
        servers.append(_start_or_fail(tmp_path_factory.mktemp("etcd")))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()
