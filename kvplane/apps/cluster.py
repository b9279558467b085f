"""A control plane and its agents as local child processes: for `kvplane up`, the demo and tests.

Each child is `python -m kvplane controlplane|agent ...` with its output in a log file; with an
external engine (`engine=EngineLaunchConfig(...)`, kvplane/apps/engine_launch.py) each agent also gets
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

Several control-plane replicas (`num_controlplanes`, an etcd store; `bus` carries load reports and
KV events: the store by default, or NATS, `bus="nats://HOST:PORT"`) serve at once: agents and
clients get all their endpoints (`endpoint` is the comma-separated list the SDK takes) and fail
over between them. Every replica is started with the same control-plane certificate (one identity,
"controlplane"; the ticket-signing key they share lives in the store, controlplane/secrets.py),
and the admin's client files are published for each replica's endpoint. `respawn(name)` starts a
child again with its own arguments (what kvplane.apps.supervisor does when one crashes).
"""

from __future__ import annotations

import atexit
import os
import random
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

import grpc

from kvplane.apps.engine_launch import EngineLaunchConfig, server_for_agent
from kvplane.client import Client
from kvplane.errors import KvplaneError, UnavailableError
from kvplane.security.local import LocalCredentials

CONTROLPLANE = "controlplane"
ENGINE_PREFIX = "engine-"  # the engine server beside agent <id> is process "engine-<id>"
LOCALHOST = "127.0.0.1"
_ROLES = ("prefill", "decode", "both")
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding kvplane/


class ClusterError(RuntimeError):
    """The local cluster could not start; the message carries the failing process's log tail."""


def controlplane_name(index: int) -> str:
    """The process name of replica `index`: "controlplane", then "controlplane-1", ..."""
    return CONTROLPLANE if index == 0 else f"{CONTROLPLANE}-{index}"


def _kill_group(process: subprocess.Popen) -> None:
    """Kills what an exited child left in its process group (each child leads its own session): an
    engine server's workers outlive a server that was killed or stopped before it stopped them
    (vLLM's EngineCore and Worker did, one pair per engine-suite run, 1.8 GB each)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing is left in it


def _poll(process: subprocess.Popen) -> int | None:
    """process.poll(), having first killed what an exited child left in its process group. Before
    the child is reaped its pid, the group's id, cannot be given to another process, so the signal
    reaches that group only (after, a group left empty frees the pid for reuse)."""
    if process.returncode is None and hasattr(os, "waitid"):
        try:
            exited = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped already
            exited = False
        if exited:
            _kill_group(process)
            process.kvplane_group_killed = True  # type: ignore[attr-defined]
    return process.poll()


def _wait(process: subprocess.Popen, timeout: float | None = None) -> int:
    """process.wait(timeout), with what the child left killed when its exit is seen, before it is
    reaped (_poll); subprocess.TimeoutExpired as wait's."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while (code := _poll(process)) is None:
        if deadline is not None and time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(process.args, timeout)
        time.sleep(0.01)
    return code


def _kill_group_left(process: subprocess.Popen) -> None:
    """For a child reaped elsewhere (its exit not seen by _poll): what it left, killed late."""
    if not getattr(process, "kvplane_group_killed", False):
        _kill_group(process)


def _tokenizer_args(agent_args: tuple[str, ...], engine: EngineLaunchConfig | None, controlplane_args) -> tuple[str, ...]:
    """`--tokenizer DIR` for the control plane when the agents serve a model directory (its own
    tokenizer): the control plane tokenizes every prompt itself (controlplane/tokenizer.py)."""
    if "--tokenizer" in controlplane_args:
        return ()
    model = engine.model if engine is not None else None
    if model is None and "--model" in agent_args[:-1]:
        model = agent_args[agent_args.index("--model") + 1]
    return ("--tokenizer", str(model)) if model and Path(model).is_dir() else ()


def free_port(host: str = LOCALHOST) -> int:
    """A port that was free a moment ago, for a child process to listen on. Drawn below the
    kernel's ephemeral range: a port from bind(0) comes from that range, where any process's next
    outgoing connection or port-0 listener may take it before the child binds it (seen as
    "Address already in use" in the suite); below it, only another draw can, one in thousands.
    $KVPLANE_FREE_PORTS=LOW-HIGH (HIGH excluded) draws from that range instead: launchers running
    side by side (the test suite's processes) each draw from their own and never take each other's."""
    low, high = free_port_range()
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(low, high) if high > low else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue  # taken: draw again
            return sock.getsockname()[1]
    raise OSError(f"no free port on {host} in {low}-{high} after 100 draws")


_PORTS_FROM = 20000  # above the well-known and most registered service ports
FREE_PORTS_ENV = "KVPLANE_FREE_PORTS"


def free_port_range() -> tuple[int, int]:
    """(low, high) that free_port draws from: $KVPLANE_FREE_PORTS, else 20000 up to the kernel's
    ephemeral range; an empty range (low == high) when that leaves under 1,000 ports (bind(0) then)."""
    value = os.environ.get(FREE_PORTS_ENV)
    if not value:
        low = _ephemeral_low()
        return (_PORTS_FROM, low) if low - _PORTS_FROM > 1000 else (low, low)
    try:
        low, high = (int(part) for part in value.split("-"))
    except ValueError:
        raise ValueError(f"{FREE_PORTS_ENV}={value!r}: expected LOW-HIGH, e.g. 20000-24000") from None
    if not 1024 <= low < high <= 65536:
        raise ValueError(f"{FREE_PORTS_ENV}={value!r}: expected 1024 <= LOW < HIGH <= 65536")
    return low, high


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class LocalCluster:
    """Starts a control plane plus `num_prefill`/`num_decode`/`num_both` agents; a context manager.

    Worker ids are "<role>-<i>" (prefill-0, decode-0, both-0, ...); process names are the
    worker ids plus "controlplane". `start()` returns once ListWorkers shows every agent.
    With `agents_per_process` K > 1 (sleeping engines such as sim), each "<role>-<i>" is instead
    one process running K agents, worker ids "<role>-<i>-0" .. "<role>-<i>-<K-1>"
    (`hosted_workers`); restart_agent() and wait_until_serving() take single agents only.
    """

    def __init__(
        self,
        num_prefill: int = 1,
        num_decode: int = 1,
        num_both: int = 0,
        store: str = "memory",
        port: int | None = None,
        num_controlplanes: int = 1,
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
        agents_per_process: int = 1,
        bus: str = "auto",
    ) -> None:
        counts = {"prefill": num_prefill, "decode": num_decode, "both": num_both}
        for role, count in counts.items():
            if count < 0:
                raise ValueError(f"num_{role} must be >= 0, got {count}")
        if sum(counts.values()) == 0:
            raise ValueError("a cluster needs at least one agent (num_prefill, num_decode or num_both)")
        if agents_per_process < 1:
            raise ValueError(f"agents_per_process must be >= 1, got {agents_per_process}")
        if agents_per_process > 1 and engine is not None:
            raise ValueError("an external engine has one server per agent: agents_per_process must be 1")
        if num_controlplanes < 1:
            raise ValueError(f"num_controlplanes must be >= 1, got {num_controlplanes}")
        if num_controlplanes > 1 and not store.startswith("etcd://"):
            raise ValueError("control-plane replicas share state through etcd: give store='etcd://HOST:PORT[,HOST:PORT...]'")
        if num_controlplanes > 1 and bus in ("memory", "memory://"):
            raise ValueError("the in-process bus serves one replica: give bus='store' or bus='nats://HOST:PORT'")
        self._bus = bus
        self._num_controlplanes = num_controlplanes
        self._counts = counts
        self._store = store
        self._port = port
        self._agent_args = tuple(agent_args)
        self._controlplane_args = tuple(controlplane_args) + _tokenizer_args(self._agent_args, engine, controlplane_args)
        self._http_port = http_port  # the OpenAI-compatible HTTP API: None = off, 0 = a free port
        self._log_dir_arg = Path(log_dir) if log_dir is not None else None
        self._owns_log_dir = log_dir is None
        self._env = dict(env or {})  # extra environment of every child (e.g. OTEL_* settings)
        self._engine = engine.validate() if engine is not None else None
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._insecure = insecure
        self._agents_per_process = agents_per_process
        self.credentials: LocalCredentials | None = None  # made at start()
        self._http_args: list[str] = []
        self.http_token = ""  # a bearer token (client, tenant "local") for the HTTP API

        self.log_dir: Path | None = None
        self.endpoint = ""  # every replica, comma-separated (what Client and agents take)
        self.controlplane_endpoints: dict[str, str] = {}  # replica name -> host:port
        # "https://127.0.0.1:PORT/v1" when the HTTP API is on, on the first replica ("http://" with insecure=True)
        self.http_url = ""
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.started_at: dict[str, float] = {}  # name -> time.monotonic() of its latest start
        self.worker_endpoints: dict[str, str] = {}
        self.hosted_workers: dict[str, list[str]] = {}  # process name -> its worker ids (agents_per_process > 1)
        self.engine_endpoints: dict[str, str] = {}  # worker id -> the API of the engine server beside it
        self.log_paths: dict[str, Path] = {}
        self._log_files: list[IO[bytes]] = []
        self._agent_argv: dict[str, list[str]] = {}
        self._argv: dict[str, tuple[list[str], dict[str, str] | None]] = {}  # every child's command, for respawn()
        self._started = False
        self._ports_given: set[int] = {p for p in (port, http_port) if p}  # see _free_port

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        if self._started:
            raise RuntimeError("this LocalCluster was already started; make a new one")
        self._started = True
        atexit.register(self.stop)  # a crashing caller must not leave orphan servers behind
        try:
            self._prepare_log_dir()
            ports = [self._port or self._free_port()] + [self._free_port() for _ in range(self._num_controlplanes - 1)]
            for i, port in enumerate(ports):
                self.controlplane_endpoints[controlplane_name(i)] = f"{LOCALHOST}:{port}"
            self.endpoint = ",".join(self.controlplane_endpoints.values())
            if self._http_port is not None:
                http_port = self._http_port or self._free_port()
                self.http_url = f"{'http' if self._insecure else 'https'}://{LOCALHOST}:{http_port}/v1"
                self._http_args = ["--http-port", str(http_port)]
            self._make_credentials()
            for i, (name, endpoint) in enumerate(self.controlplane_endpoints.items()):
                self._spawn(name, self._controlplane_argv(endpoint, first=i == 0))
            for role in _ROLES:
                for index in range(self._counts[role]):
                    self._start_agent(role, index)
            self.wait_until_registered(self._startup_timeout)
        except BaseException:
            self.stop()  # also on Ctrl-C during startup
            raise
        return self

    def wait_until_registered(self, timeout: float, endpoint: str | None = None) -> None:
        """Blocks until ListWorkers (on `endpoint`, default any replica) shows every agent;
        ClusterError if a child dies or time runs out."""
        deadline = time.monotonic() + timeout
        expected = set(self.worker_endpoints).union(*self.hosted_workers.values())
        seen: set[str] = set()
        last_error = "the control plane has not answered yet"
        with self.client(endpoint, timeout=2.0) as client:
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
        culprit = missing[0] if missing else next(iter(self.controlplane_endpoints))
        raise ClusterError(
            f"the cluster was not ready within {timeout:g} s: not registered: {', '.join(missing) or 'none'}"
            f"{'; ' + last_error if last_error else ''}; last lines of {self.log_paths[culprit]}:\n"
            f"{self.log_tail(culprit)}"
        )

    def stop(self) -> None:
        """Stops every child (agents, then the control plane); safe to call more than once."""
        atexit.unregister(self.stop)
        replicas = [name for name in self.processes if name in self.controlplane_endpoints]
        engines = [name for name in self.processes if name.startswith(ENGINE_PREFIX)]
        self._terminate([name for name in self.processes if name not in replicas and name not in engines])
        self._terminate(engines)
        self._terminate(replicas)
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
        self._start_agent(role, worker_id=worker_id, extra_args=agent_args)
        self.wait_until_serving(worker_id, timeout)

    def restart_agent(self, worker_id: str, sig: signal.Signals = signal.SIGTERM, timeout: float = 60.0) -> None:
        """Stops one agent with `sig`, waits for it to exit, starts it again with the same id, port
        and arguments, and returns once the new process serves and has registered."""
        if worker_id not in self._agent_argv:
            raise ValueError(f"no agent named {worker_id!r}; known: {', '.join(self._agent_argv)}")
        self._stop_one(worker_id, sig, timeout)
        self.respawn(worker_id)
        self.wait_until_serving(worker_id, timeout)

    def add_controlplane(self, name: str = "controlplane-2") -> str:
        """Starts another control-plane replica on the same store (etcd) and returns its endpoint.
        Agents started before it do not know it; clients may name it."""
        if not self._store.startswith("etcd://"):
            raise ValueError("replicas share state through etcd: start the cluster with store='etcd://HOST:PORT'")
        endpoint = f"{LOCALHOST}:{self._free_port()}"
        self.controlplane_endpoints[name] = endpoint
        assert self.credentials is not None
        self.credentials.publish(endpoint)
        self._spawn(name, self._controlplane_argv(endpoint, first=False))
        self.wait_until_registered(self._startup_timeout, endpoint=endpoint)
        return endpoint

    def restart_controlplane(self, sig: signal.Signals = signal.SIGKILL, timeout: float = 60.0, name: str = CONTROLPLANE) -> None:
        """Kills a control-plane replica with `sig` and starts a fresh one on the same port and store.

        Agents keep running and reconnect by themselves; returns once all have registered again
        (with an embedded store they re-register; with etcd their leases carried over).
        """
        self._stop_one(name, sig, timeout)
        self.respawn(name)
        self.wait_until_registered(timeout, endpoint=self.controlplane_endpoints[name])

    def respawn(self, name: str) -> None:
        """Starts child `name` again with the command it last ran with (it must have exited)."""
        if name not in self._argv:
            raise ValueError(f"no process named {name!r}; known: {', '.join(self._argv)}")
        if _poll(self.processes[name]) is None:  # an exit not yet seen: what it left goes first
            raise ValueError(f"{name} is still running (pid {self.processes[name].pid})")
        argv, env = self._argv[name]
        self._spawn(name, argv, env=env)

    def wait_until_serving(self, worker_id: str, timeout: float = 60.0) -> None:
        """Blocks until this incarnation of the agent answers gRPC health SERVING and the control
        plane lists it; ClusterError if it exits or time runs out. The health check is the one
        RPC an agent answers without a ticket; it dials with the local admin's credentials."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: PLC0415 (grpc only when used)

        from kvplane import grpc_util  # noqa: PLC0415

        assert self.credentials is not None
        deadline = time.monotonic() + timeout
        with grpc_util.channel(self.worker_endpoints[worker_id], self.credentials.admin) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if _poll(self.processes[worker_id]) is not None:
                    raise ClusterError(f"{worker_id} exited while starting; last lines of its log:\n{self.log_tail(worker_id)}")
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"{worker_id} did not serve within {timeout:g} s; last lines of its log:\n{self.log_tail(worker_id)}"
                    )
                time.sleep(0.1)
        self.wait_until_registered(max(deadline - time.monotonic(), 1.0))

    # -- inspection and fault injection --------------------------------------------------------

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Sends `sig` to one child (a worker id or "controlplane")."""
        try:
            process = self.processes[name]
        except KeyError:
            raise ValueError(f"no process named {name!r}; known: {', '.join(self.processes)}") from None
        if _poll(process) is None:
            process.send_signal(sig)

    def exited(self, *, nonzero_only: bool = False) -> dict[str, int]:
        """Children that have exited, name -> exit code (negative: killed by that signal)."""
        codes = {name: _poll(p) for name, p in self.processes.items()}  # what an exited child left is killed
        return {name: code for name, code in codes.items() if code is not None and (code != 0 or not nonzero_only)}

    def log_tail(self, name: str, num_lines: int = 30) -> str:
        path = self.log_paths.get(name)
        if path is None or not path.exists():
            return "(no log)"
        lines = path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-num_lines:]) or "(log is empty)"

    # -- credentials -----------------------------------------------------------------------------

    def client(self, endpoint: str | None = None, **kwargs) -> Client:
        """An SDK client of this cluster (every replica by default) as its local admin (any
        Client(endpoint) on this machine is one too)."""
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
        for endpoint in self.controlplane_endpoints.values():
            self.credentials.publish(endpoint)
        self.http_token = self.credentials.http_token

    def _controlplane_argv(self, endpoint: str, first: bool = True) -> list[str]:
        """A replica's argv (every one has the control plane's certificate); only the first
        serves the HTTP API (its port is fixed)."""
        assert self.credentials is not None
        port = endpoint.rpartition(":")[2]
        return [
            CONTROLPLANE, "--host", LOCALHOST, "--port", port, "--store", self._store, "--bus", self._bus,
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

    def _free_port(self) -> int:
        """free_port(), never a port this cluster gave out before: a child may not have bound its
        port yet when the next is drawn (seen: an agent handed the port given for the control plane)."""
        while (port := free_port()) in self._ports_given:
            pass
        self._ports_given.add(port)
        return port

    def _start_agent(self, role: str, index: int = 0, worker_id: str = "", extra_args: tuple[str, ...] | list[str] = ()) -> None:
        worker_id = worker_id or f"{role}-{index}"
        if self._agents_per_process > 1:
            self._start_agent_host(role, worker_id)
            return
        port = self._free_port()
        self.worker_endpoints[worker_id] = f"{LOCALHOST}:{port}"
        self._agent_argv[worker_id] = [
            "agent", "--role", role, "--host", LOCALHOST, "--port", str(port),
            "--controlplane", ",".join(self.controlplane_endpoints.values()), "--worker-id", worker_id,
            *self._worker_security(worker_id), *self._engine_server(worker_id), *self._agent_args, *extra_args,
        ]  # fmt: skip
        self._spawn(worker_id, self._agent_argv[worker_id])

    def _start_agent_host(self, role: str, name: str) -> None:
        """One process running agents_per_process agents (`kvplane agent --count`), worker ids
        NAME-0, NAME-1, ..., each on a free port."""
        assert self.credentials is not None
        worker_ids = [f"{name}-{i}" for i in range(self._agents_per_process)]
        self.hosted_workers[name] = worker_ids
        self._agent_argv[name] = [
            "agent", "--role", role, "--host", LOCALHOST, "--port", "0", "--count", str(len(worker_ids)),
            "--controlplane", ",".join(self.controlplane_endpoints.values()), "--worker-id", name,
            *self.credentials.workers_args(worker_ids), *self._agent_args,
        ]  # fmt: skip
        self._spawn(name, self._agent_argv[name])

    def _stop_one(self, name: str, sig: signal.Signals, timeout: float) -> None:
        if sig == signal.SIGSTOP:
            raise ValueError("a stopped process never exits; stop it with SIGTERM or SIGKILL")
        process = self.processes[name]
        if _poll(process) is None:
            process.send_signal(sig)
            _wait(process, timeout)
        _kill_group_left(process)

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
        self._argv[name] = (list(kvplane_args), env)
        self.started_at[name] = time.monotonic()
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
        running = [self.processes[n] for n in names if _poll(self.processes[n]) is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + self._stop_timeout
        for process in running:
            try:
                _wait(process, max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                _wait(process)
        for name in names:
            _kill_group_left(self.processes[name])
