"""A control plane and its agents as local child processes: for `kvplane up`, the demo and tests.

Each child is `python -m kvplane controlplane|agent ...` with its output in a log file; with an
external engine (`engine=EngineLaunchConfig(...)`, kvplane/engine_launch.py) each agent also gets
an engine server of its own ("engine-<worker id>"), started just before it (the agent waits for it).
Children run in their own session so that a terminal's Ctrl-C reaches only the launcher,
which then stops them in order: agents first (so they can give up their leases while the
control plane and its embedded store still run), then engine servers, then the control plane; SIGTERM first,
SIGKILL for whatever has not exited within the grace period.

Security is on by default, with throw-away credentials (kvplane.security.local): a CA and a
certificate for the control plane, each worker and a local admin, made at start. The admin's client
files are published in the credentials directory for the cluster's endpoint, where the SDK and CLI
on this machine find them with no flag; stop() removes them. `insecure=True` runs plaintext with
random join and admin tokens instead.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from kvplane.client import Client
from kvplane.engine_launch import EngineLaunchConfig, server_for_agent
from kvplane.errors import KvplaneError, UnavailableError
from kvplane.security.local import LocalCredentials

CONTROLPLANE = "controlplane"
ENGINE_PREFIX = "engine-"  # the engine server beside agent <id> is process "engine-<id>"
LOCALHOST = "127.0.0.1"
_ROLES = ("prefill", "decode", "both")
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the directory holding kvplane/


class ClusterError(RuntimeError):
    """The local cluster could not start; the message carries the failing process's log tail."""


def free_port(host: str = LOCALHOST) -> int:
    """A port that was free a moment ago (bind port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LocalCluster:
    """Starts a control plane plus `num_prefill`/`num_decode`/`num_both` agents; a context manager.

    Worker ids are "<role>-<i>" (prefill-0, decode-0, both-0, ...); process names are the
    worker ids plus "controlplane". `start()` returns once ListWorkers shows every agent.
    """

    def __init__(
        self,
        num_prefill: int = 1,
        num_decode: int = 1,
        num_both: int = 0,
        store: str = "memory",
        port: int | None = None,
        agent_args: tuple[str, ...] | list[str] = (),
        controlplane_args: tuple[str, ...] | list[str] = (),
        log_dir: str | os.PathLike[str] | None = None,
        *,
        http_port: int | None = None,
        env: dict[str, str] | None = None,
        engine: EngineLaunchConfig | None = None,
        startup_timeout: float = 90.0,
        stop_timeout: float = 10.0,
        insecure: bool = False,
    ) -> None:
        counts = {"prefill": num_prefill, "decode": num_decode, "both": num_both}
        for role, count in counts.items():
            if count < 0:
                raise ValueError(f"num_{role} must be >= 0, got {count}")
        if sum(counts.values()) == 0:
            raise ValueError("a cluster needs at least one agent (num_prefill, num_decode or num_both)")
        self._counts = counts
        self._store = store
        self._port = port
        self._agent_args = tuple(agent_args)
        self._controlplane_args = tuple(controlplane_args)
        self._http_port = http_port  # the OpenAI-compatible HTTP API: None = off, 0 = a free port
        self._log_dir_arg = Path(log_dir) if log_dir is not None else None
        self._owns_log_dir = log_dir is None
        self._env = dict(env or {})  # extra environment of every child (e.g. OTEL_* settings)
        self._engine = engine.validate() if engine is not None else None
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._insecure = insecure
        self.credentials: LocalCredentials | None = None  # made at start()
        self._http_args: list[str] = []
        self.http_token = ""  # a bearer token (client, tenant "local") for the HTTP API

        self.log_dir: Path | None = None
        self.endpoint = ""
        self.http_url = ""  # "https://127.0.0.1:PORT/v1" when the HTTP API is on ("http://" with insecure=True)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.worker_endpoints: dict[str, str] = {}
        self.engine_endpoints: dict[str, str] = {}  # worker id -> the API of the engine server beside it
        self.log_paths: dict[str, Path] = {}
        self._log_files: list[IO[bytes]] = []
        self._agent_argv: dict[str, list[str]] = {}
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        if self._started:
            raise RuntimeError("this LocalCluster was already started; make a new one")
        self._started = True
        atexit.register(self.stop)  # a crashing caller must not leave orphan servers behind
        try:
            self._prepare_log_dir()
            port = self._port or free_port()
            self.endpoint = f"{LOCALHOST}:{port}"
            if self._http_port is not None:
                http_port = self._http_port or free_port()
                self.http_url = f"{'http' if self._insecure else 'https'}://{LOCALHOST}:{http_port}/v1"
                self._http_args = ["--http-port", str(http_port)]
            self._make_credentials()
            self._spawn(CONTROLPLANE, self._controlplane_argv(port))
            for role in _ROLES:
                for index in range(self._counts[role]):
                    self._start_agent(role, index, port)
            self.wait_until_registered(self._startup_timeout)
        except BaseException:
            self.stop()  # also on Ctrl-C during startup
            raise
        return self

    def wait_until_registered(self, timeout: float) -> None:
        """Blocks until ListWorkers shows every agent; ClusterError if a child dies or time runs out."""
        deadline = time.monotonic() + timeout
        expected = set(self.worker_endpoints)
        seen: set[str] = set()
        last_error = "the control plane has not answered yet"
        with self.client(timeout=2.0) as client:
            while True:
                exited = self.exited()
                if exited:
                    name, code = next(iter(exited.items()))
                    raise ClusterError(
                        f"{name} exited with code {code} during startup; last lines of {self.log_paths[name]}:\n{self.log_tail(name)}"
                    )
                try:
                    seen = {w.worker_id for w in client.workers()}
                    last_error = ""
                except UnavailableError as e:
                    last_error = str(e)
                except KvplaneError as e:
                    last_error = f"ListWorkers failed: {e}"
                if expected <= seen:
                    return
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
        missing = sorted(expected - seen)
        culprit = missing[0] if missing else CONTROLPLANE
        raise ClusterError(
            f"the cluster was not ready within {timeout:g} s: not registered: {', '.join(missing) or 'none'}"
            f"{'; ' + last_error if last_error else ''}; last lines of {self.log_paths[culprit]}:\n"
            f"{self.log_tail(culprit)}"
        )

    def stop(self) -> None:
        """Stops every child (agents, then the control plane); safe to call more than once."""
        atexit.unregister(self.stop)
        agents = [name for name in self.processes if name != CONTROLPLANE and not name.startswith(ENGINE_PREFIX)]
        self._terminate(agents)
        self._terminate([name for name in self.processes if name.startswith(ENGINE_PREFIX)])
        self._terminate([CONTROLPLANE] if CONTROLPLANE in self.processes else [])
        for log_file in self._log_files:
            log_file.close()
        self._log_files.clear()
        if self.credentials is not None:
            self.credentials.remove()
            shutil.rmtree(self.credentials.directory, ignore_errors=True)
        if self._owns_log_dir and self.log_dir is not None and not self.exited(nonzero_only=True):
            shutil.rmtree(self.log_dir, ignore_errors=True)  # kept when something failed, for reading

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def add_agent(self, role: str, worker_id: str, agent_args: tuple[str, ...] | list[str] = (), timeout: float = 60.0) -> None:
        """Starts one more agent with its own extra arguments and waits until it has registered."""
        if role not in _ROLES:
            raise ValueError(f"role must be one of {_ROLES}, got {role!r}")
        if worker_id in self.processes:
            raise ValueError(f"a process named {worker_id!r} already runs in this cluster")
        port = free_port()
        self.worker_endpoints[worker_id] = f"{LOCALHOST}:{port}"
        self._agent_argv[worker_id] = [
            "agent", "--role", role, "--host", LOCALHOST, "--port", str(port),
            "--controlplane", self.endpoint, "--worker-id", worker_id, *self._worker_security(worker_id),
            *self._agent_args, *agent_args,
        ]  # fmt: skip
        self._spawn(worker_id, self._agent_argv[worker_id])
        self.wait_until_registered(timeout)

    def restart_agent(self, worker_id: str, sig: signal.Signals = signal.SIGTERM, timeout: float = 60.0) -> None:
        """Stops one agent with `sig`, waits for it to exit, starts it again with the same id, port
        and arguments, and returns once it has registered."""
        if worker_id not in self._agent_argv:
            raise ValueError(f"no agent named {worker_id!r}; known: {', '.join(self._agent_argv)}")
        process = self.processes[worker_id]
        if process.poll() is None:
            process.send_signal(sig)
            process.wait(timeout=timeout)
        self._spawn(worker_id, self._agent_argv[worker_id])
        self.wait_until_registered(timeout)

    def add_controlplane(self, name: str = "controlplane-2") -> str:
        """Starts another control-plane replica on the same store (etcd) and returns its endpoint."""
        if not self._store.startswith("etcd://"):
            raise ValueError("replicas share state through etcd: start the cluster with store='etcd://HOST:PORT'")
        port = free_port()
        self._spawn(name, self._controlplane_argv(port, first=False))
        endpoint = f"{LOCALHOST}:{port}"
        assert self.credentials is not None
        self.credentials.publish(endpoint)
        deadline = time.monotonic() + self._startup_timeout
        with self.client(endpoint, timeout=2.0) as client:
            while True:
                try:
                    if {w.worker_id for w in client.workers()} >= set(self.worker_endpoints):
                        return endpoint
                except KvplaneError:
                    pass
                if self.processes[name].poll() is not None or time.monotonic() > deadline:
                    raise ClusterError(f"{name} did not start; last lines of its log:\n{self.log_tail(name)}")
                time.sleep(0.2)

    def restart_controlplane(self, sig: signal.Signals = signal.SIGKILL, timeout: float = 60.0) -> None:
        """Kills the control plane with `sig` and starts a fresh one on the same port and store.

        Agents keep running and reconnect by themselves; returns once all have registered again
        (with an embedded store they re-register; with etcd their leases carried over).
        """
        process = self.processes[CONTROLPLANE]
        if process.poll() is None:
            process.send_signal(sig)
            process.wait(timeout=timeout)
        port = self.endpoint.rpartition(":")[2]
        self._spawn(CONTROLPLANE, self._controlplane_argv(int(port)))
        self.wait_until_registered(timeout)

    # -- inspection and fault injection --------------------------------------------------------

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Sends `sig` to one child (a worker id or "controlplane")."""
        try:
            process = self.processes[name]
        except KeyError:
            raise ValueError(f"no process named {name!r}; known: {', '.join(self.processes)}") from None
        if process.poll() is None:
            process.send_signal(sig)

    def exited(self, *, nonzero_only: bool = False) -> dict[str, int]:
        """Children that have exited, name -> exit code (negative: killed by that signal)."""
        codes = {name: p.poll() for name, p in self.processes.items()}
        return {name: code for name, code in codes.items() if code is not None and (code != 0 or not nonzero_only)}

    def log_tail(self, name: str, num_lines: int = 30) -> str:
        path = self.log_paths.get(name)
        if path is None or not path.exists():
            return "(no log)"
        lines = path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-num_lines:]) or "(log is empty)"

    # -- credentials -----------------------------------------------------------------------------

    def client(self, endpoint: str | None = None, **kwargs) -> Client:
        """An SDK client of this cluster as its local admin (any Client(endpoint) on this machine is one too)."""
        assert self.credentials is not None, "start() the cluster first"
        return Client(endpoint or self.endpoint, credentials=self.credentials.admin, **kwargs)

    @property
    def http_ca(self) -> str | bool:
        """What an HTTP client verifies the HTTP API against: the cluster CA's file (True, the system's, when plaintext)."""
        assert self.credentials is not None, "start() the cluster first"
        return True if self.credentials.insecure else str(self.credentials.ca_path)

    def _make_credentials(self) -> None:
        directory = Path(tempfile.mkdtemp(prefix="kvplane-credentials-"))
        self.credentials = LocalCredentials.plaintext(directory) if self._insecure else LocalCredentials.create(directory)
        self.credentials.publish(self.endpoint)
        self.http_token = self.credentials.http_token

    def _controlplane_argv(self, port: int, first: bool = True) -> list[str]:
        """The control plane's argv; only the first replica serves the HTTP API (its port is fixed)."""
        assert self.credentials is not None
        return [
            CONTROLPLANE, "--host", LOCALHOST, "--port", str(port), "--store", self._store,
            *(self._http_args if first else []), *self.credentials.controlplane_args(), *self._controlplane_args,
        ]  # fmt: skip

    def _worker_security(self, worker_id: str) -> list[str]:
        assert self.credentials is not None
        return self.credentials.worker_args(worker_id)

    # -- internals -----------------------------------------------------------------------------

    def _prepare_log_dir(self) -> None:
        if self._log_dir_arg is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="kvplane-cluster-"))
        else:
            self.log_dir = self._log_dir_arg
            self.log_dir.mkdir(parents=True, exist_ok=True)

    def _start_agent(self, role: str, index: int, controlplane_port: int) -> None:
        worker_id = f"{role}-{index}"
        port = free_port()
        self.worker_endpoints[worker_id] = f"{LOCALHOST}:{port}"
        self._agent_argv[worker_id] = [
            "agent", "--role", role, "--host", LOCALHOST, "--port", str(port),
            "--controlplane", f"{LOCALHOST}:{controlplane_port}", "--worker-id", worker_id,
            *self._worker_security(worker_id), *self._engine_server(worker_id), *self._agent_args,
        ]  # fmt: skip
        self._spawn(worker_id, self._agent_argv[worker_id])

    def _engine_server(self, worker_id: str) -> list[str]:
        """Starts the engine server beside agent `worker_id` (if the cluster has an external
        engine) and returns the agent flags that point at it."""
        if self._engine is None:
            return []
        server = server_for_agent(self._engine)
        self.engine_endpoints[worker_id] = server.endpoint
        self._spawn(ENGINE_PREFIX + worker_id, server.argv, env=server.env)
        return server.agent_args

    def _spawn(self, name: str, kvplane_args: list[str], env: dict[str, str] | None = None) -> None:
        """Starts `python -m kvplane ARGS`, or with `env` given, the command `kvplane_args` itself."""
        assert self.log_dir is not None
        path = self.log_dir / f"{name}.log"
        log_file = path.open("ab")
        self._log_files.append(log_file)
        self.log_paths[name] = path
        if env is not None:  # an engine server: its own interpreter and environment
            argv, env = kvplane_args, dict(env, PYTHONUNBUFFERED="1")
        else:
            argv = [sys.executable, "-m", "kvplane", *kvplane_args]
            env = dict(os.environ, PYTHONUNBUFFERED="1", **self._env, **(self.credentials.env() if self.credentials else {}))
            # The children import this same kvplane even when it is not installed (e.g. a checkout).
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH")]))
        self.processes[name] = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def _terminate(self, names: list[str]) -> None:
        running = [self.processes[n] for n in names if self.processes[n].poll() is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + self._stop_timeout
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
