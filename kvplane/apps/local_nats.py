"""nats-server with JetStream on loopback, as a child process: for tests, the chaos suite and
`kvplane bench controlplane --bus nats`.

`start_nats(tmp_dir)` starts one server and returns once its monitoring endpoint says it is
healthy with JetStream on. Its storage lives under tmp_dir, so `restart()` (or `kill()` and
`restart()`) brings the same streams back, as a restarted server with a persistent volume does.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kvplane.apps.cluster import free_port as _free_port
from kvplane.apps.local_etcd import kill_server, stop_server

NATS_MISSING = (
    "the nats-server binary was not found on PATH; run `make nats` (it installs nats-server from the package archive), "
    "or install nats-server 2.9+ yourself and put it on PATH"
)


class NatsNotFound(RuntimeError):
    pass


@dataclass(slots=True)
class NatsServer:
    process: subprocess.Popen
    client_port: int
    monitor_port: int
    store_dir: Path
    log_path: Path
    extra_args: tuple[str, ...] = ()  # e.g. nats-server's --tls flags

    @property
    def url(self) -> str:
        """The bus URL (`kvplane controlplane --bus`)."""
        return f"{'tls' if '--tls' in self.extra_args else 'nats'}://127.0.0.1:{self.client_port}"

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM, then SIGKILL after 5 s). Idempotent."""
        stop_server(self.process)

    def kill(self) -> None:
        """Crash it (SIGKILL); its storage survives for restart()."""
        kill_server(self.process)

    def restart(self, timeout_s: float = 15.0) -> None:
        """Stop it if running, then start it again on the same ports with the same storage."""
        self.stop()
        self.process = start_nats(self.store_dir.parent, self.client_port, self.monitor_port, timeout_s, self.extra_args).process


def _launch(binary: str, tmp_dir: Path, client_port: int, monitor_port: int, extra_args: tuple[str, ...]) -> NatsServer:
    store_dir, log_path = tmp_dir / "jetstream", tmp_dir / "nats.log"
    args = [binary, "-a", "127.0.0.1", "-p", str(client_port), "-m", str(monitor_port), "-js", "-sd", str(store_dir), *extra_args]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return NatsServer(process, client_port, monitor_port, store_dir, log_path, tuple(extra_args))


def _wait_healthy(server: NatsServer, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            # /healthz answers 200 only once JetStream is up (and its streams recovered).
            with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/healthz?js-enabled-only=true", timeout=0.5):
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def start_nats(
    tmp_dir: Path | str,
    client_port: int | None = None,
    monitor_port: int | None = None,
    timeout_s: float = 15.0,
    extra_args: tuple[str, ...] = (),
) -> NatsServer:
    """Start nats-server -js with its storage and log under tmp_dir; return once it is healthy.
    Ports default to free loopback ports (retried if another process grabs one first); `extra_args`
    go to nats-server as they are (its TLS flags, say)."""
    binary = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/local/sbin")
    if binary is None:
        raise NatsNotFound(NATS_MISSING)
    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    num_attempts = 1 if client_port is not None else 3
    for _ in range(num_attempts):
        server = _launch(binary, tmp_dir, client_port or _free_port(), monitor_port or _free_port(), extra_args)
        if _wait_healthy(server, timeout_s):
            return server
        server.kill()
    log = server.log_path.read_text(errors="replace").splitlines()[-15:] if server.log_path.exists() else ["(no log)"]
    raise RuntimeError(f"nats-server did not become healthy on port {server.client_port}; log tail:\n" + "\n".join(log))
