"""etcd on loopback, as a child process: for tests, the chaos suite and `kvplane bench controlplane`.

`start_etcd(tmp_dir)` starts one server and returns once it answers /health; `start_etcd_cluster`
starts several members forming one cluster. The servers run with a 25 ms heartbeat and a 250 ms
election timeout: a single member elects itself in ~0.3 s, and etcd's minimum lease TTL (1.5 x
election timeout, rounded up) drops from 2 s to 1 s, so lease tests can use ttl=1.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kvplane.apps.cluster import free_port as _free_port

ETCD_MISSING = (
    "the etcd binary was not found on PATH; run `make test` (it installs etcd-server), or install etcd 3.4+ yourself and put it on PATH"
)


class EtcdNotFound(RuntimeError):
    pass


@dataclass(slots=True)
class EtcdServer:
    process: subprocess.Popen
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    name: str = "t"
    initial_cluster: str = ""  # name=peer-url,... of every member ("" = just this one)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        """The store URL for open_store()."""
        return f"etcd://{self.endpoint}"

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM, then SIGKILL after 5 s). Idempotent."""
        stop_server(self.process)

    def kill(self) -> None:
        """Crash it (SIGKILL). The data dir survives, so restart() brings the same data back."""
        kill_server(self.process)

    def restart(self, timeout_s: float = 15.0) -> None:
        """Stop it if running, then start it again on the same ports with the same data."""
        self.stop()
        if self.initial_cluster:  # a cluster member: it is healthy once it rejoined a quorum
            self.process = _launch(shutil.which("etcd"), self.data_dir.parent, self.client_port, self.peer_port,
                                   self.name, self.initial_cluster).process  # fmt: skip
            return
        again = start_etcd(self.data_dir.parent, self.client_port, self.peer_port, timeout_s)
        self.process = again.process


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 5 s; nothing when it has exited (etcd and nats-server alike)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill_server(process)


def kill_server(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def _log_tail(path: Path, num_lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except OSError:
        return "(no log)"


def _launch(binary: str, tmp_dir: Path, client_port: int, peer_port: int, name: str = "t", initial_cluster: str = "") -> EtcdServer:
    client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    data_dir, log_path = tmp_dir / "data", tmp_dir / "etcd.log"
    args = [
        binary, "--name", name, "--data-dir", str(data_dir),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", initial_cluster or f"{name}={peer_url}",
        "--heartbeat-interval", "25", "--election-timeout", "250",
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return EtcdServer(process, client_port, peer_port, data_dir, log_path, name, initial_cluster)


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


@dataclass(slots=True)
class EtcdCluster:
    members: list[EtcdServer]

    @property
    def url(self) -> str:
        """The store URL naming every member."""
        return "etcd://" + ",".join(m.endpoint for m in self.members)

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Until every running member answers /health true (it has a leader)."""
        for member in self.members:
            if member.process.poll() is None and not _wait_healthy(member, timeout_s):
                raise RuntimeError(f"etcd member {member.name} is not healthy; log tail:\n{_log_tail(member.log_path)}")

    def stop(self) -> None:
        for member in self.members:
            member.stop()


def start_etcd_cluster(tmp_dir: Path | str, num_members: int = 3, timeout_s: float = 30.0) -> EtcdCluster:
    """`num_members` etcd processes on loopback forming one cluster; returns once all are healthy."""
    binary = shutil.which("etcd")
    if binary is None:
        raise EtcdNotFound(ETCD_MISSING)
    tmp_dir = Path(tmp_dir)
    ports = [(_free_port(), _free_port()) for _ in range(num_members)]
    initial = ",".join(f"m{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
    members = []
    for i, (client, peer) in enumerate(ports):
        (tmp_dir / f"m{i}").mkdir(parents=True, exist_ok=True)
        members.append(_launch(binary, tmp_dir / f"m{i}", client, peer, f"m{i}", initial))
    cluster = EtcdCluster(members)
    try:
        cluster.wait_healthy(timeout_s)
    except BaseException:
        for member in members:
            member.kill()
        raise
    return cluster
