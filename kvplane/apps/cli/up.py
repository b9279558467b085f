"""`kvplane up`: a control plane and agents as local child processes, until Ctrl-C or SIGTERM.

It supervises them (kvplane/apps/supervisor.py): a child that crashes is started again with back-off
while the rest keep serving; `kvplane up` exits only on Ctrl-C / SIGTERM, or when a child keeps
failing. With an etcd store, `--replicas N` runs N control-plane replicas that agents and
clients fail over between.

Secure by default: the cluster runs mutual TLS with throw-away certificates, and the local admin's
client credentials go where `kvplane` commands and the SDK on this machine find them (printed at
start). Every replica presents the same control-plane certificate, and a restarted child gets its
own certificate again. `--insecure` runs plaintext instead, with a warning.
"""

from __future__ import annotations

import argparse
import re
import shlex
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from kvplane.apps.cli import engine_flags
from kvplane.apps.cli.common import CliError, import_extra, non_negative_int, positive_float, positive_int
from kvplane.apps.engine_launch import ENGINES, EngineLaunchConfig
from kvplane.apps.supervisor import DEFAULT_MAX_FAILURES, GaveUp, RestartPolicy, Supervisor
from kvplane.dataplane.engines import DEFAULT_ENGINE
from kvplane.security.credentials import cluster_dir

if TYPE_CHECKING:
    from kvplane.apps.cluster import LocalCluster

DEFAULT_PORT = 50051  # the SDK's default endpoint, so other commands need no --endpoint
DEFAULT_ENGINE_BLOCK_SIZE = 32  # engine servers' block size unless --block-size says otherwise
_ETCD_STORE = re.compile(r"^etcd://[^:/\s,]+:\d+(,[^:/\s,]+:\d+)*$")


class _Stop(BaseException):
    """Raised by the signal handler to unwind to the cleanup, wherever the main thread is."""


def register(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser(
        "up",
        help="start a local cluster (control plane + agents) until Ctrl-C",
        description="Starts a control plane and agents as local child processes, prints the endpoint "
        "once every agent has registered, restarts any that crashes (with back-off), and stops them all "
        "on Ctrl-C or SIGTERM, or when one keeps failing.",
    )
    up.add_argument("--prefill", type=non_negative_int, default=None, metavar="N",
                    help="prefill agents (default: 1 with the reference engine, 0 with an external one)")  # fmt: skip
    up.add_argument("--decode", type=non_negative_int, default=None, metavar="N",
                    help="decode agents (default: 1 with the reference engine, 0 with an external one)")  # fmt: skip
    up.add_argument("--both", type=non_negative_int, default=0, metavar="N",
                    help="agents that prefill and decode (default: 0)")  # fmt: skip
    up.add_argument("--store", type=store_spec, default="memory", metavar="memory|etcd://HOST:PORT[,HOST:PORT...]",
                    help="where the control plane keeps shared state: embedded memory (default), or the members of an etcd cluster")  # fmt: skip
    up.add_argument("--bus", type=bus_spec, default="auto", metavar="auto|memory|store|nats://HOST:PORT[,...]",
                    help="how load reports and KV events reach the replicas (`kvplane controlplane --bus`): in-process with "
                    "the memory store, the store with etcd (default), or a NATS JetStream server")  # fmt: skip
    up.add_argument("--replicas", type=positive_int, default=1, metavar="N",
                    help="control-plane replicas, the first on --port, the others on free ports (needs an etcd store; default: 1)")  # fmt: skip
    up.add_argument("--max-restarts", type=positive_int, default=DEFAULT_MAX_FAILURES, metavar="N",
                    help=f"give up on a child that fails N times in a row (default: {DEFAULT_MAX_FAILURES})")  # fmt: skip
    up.add_argument("--port", type=positive_int, default=DEFAULT_PORT, metavar="P",
                    help=f"control plane port (default: {DEFAULT_PORT})")  # fmt: skip
    up.add_argument("--http-port", type=http_port_spec, default=0, metavar="P",
                    help="OpenAI-compatible HTTP API port (default: a free port; -1 = off)")  # fmt: skip
    up.add_argument("--disagg-threshold", type=non_negative_int, default=None, metavar="N",
                    help="uncached prompt tokens above which prefill runs remotely (control plane default if unset)")  # fmt: skip
    up.add_argument("--model", default=None, metavar="M",
                    help="model for every agent (agent default if unset); with --engine vllm|sglang a local model directory")  # fmt: skip
    up.add_argument("--block-size", type=positive_int, default=None, metavar="N",
                    help="tokens per KV block of every worker (default: the agent's, 16; engine servers: 32, "
                         "vLLM --block-size, SGLang --page-size)")  # fmt: skip
    engine = up.add_argument_group(
        "external engines", "--engine vllm|sglang starts one engine server beside each agent (kvplane/apps/engine_launch.py)"
    )
    engine.add_argument("--engine-python", default="", metavar="PATH",
                        help="the Python of the engine servers (default: .venv-vllm / .venv-sglang from `make engines-env`, else python3)")  # fmt: skip
    engine.add_argument(
        "--engine-device", choices=("cuda", "cpu"), default="cuda", help="cpu adds the CPU-only server flags (default: cuda)"
    )
    engine.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for every engine server (repeatable, e.g. --engine-arg=--dtype=float32)")  # fmt: skip
    up.add_argument("--num-blocks", type=positive_int, default=None, metavar="N",
                    help="KV blocks per agent (agent default if unset)")  # fmt: skip
    up.add_argument("--log-dir", default=None, metavar="DIR", help="where child logs go (default: a temp dir)")
    up.add_argument("--insecure", action="store_true",
                    help="plaintext gRPC with random join/admin tokens instead of TLS (development only)")  # fmt: skip
    up.add_argument("--startup-timeout", type=positive_float, default=120.0, metavar="SECONDS",
                    help="how long to wait for every agent to register (default: 120)")  # fmt: skip
    # --engine and every engine plugin's flags (kvplane/apps/cli/engine_flags.py): reference and sim run
    # in the agent's process; vllm and sglang get an engine server beside each agent.
    up.set_defaults(func=run_up, engine_flags=engine_flags.add_arguments(up))


def http_port_spec(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, 0 (any free port) or -1 (off), got {text!r}") from None
    if not -1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number, 0 (any free port) or -1 (off), got {value}")
    return value


def bus_spec(text: str) -> str:
    from kvplane.controlplane.bus import check_bus_url  # the control plane's own check, at parse time

    try:
        check_bus_url(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def store_spec(text: str) -> str:
    if text == "memory" or _ETCD_STORE.match(text):
        return text
    raise argparse.ArgumentTypeError(f"expected 'memory' or 'etcd://HOST:PORT[,HOST:PORT...]', got {text!r}")


def run_up(args: argparse.Namespace) -> int:
    args.engine = getattr(args, "engine", DEFAULT_ENGINE)
    external = args.engine in ENGINES  # engine servers that kvplane up starts beside the agents
    default_split = 0 if external else 1
    args.prefill = default_split if args.prefill is None else args.prefill
    args.decode = default_split if args.decode is None else args.decode
    if args.prefill + args.decode + args.both == 0:
        raise CliError("nothing to start: give at least one of --prefill, --decode, --both a count > 0", 2)
    if args.replicas > 1 and args.store == "memory":
        raise CliError("--replicas needs an etcd store (--store etcd://HOST:PORT): replicas share state through it", 2)
    if args.replicas > 1 and args.bus == "memory":
        raise CliError("--replicas needs --bus store or --bus nats://HOST:PORT: the in-process bus serves one replica", 2)
    controlplane_args: list[str] = []
    if args.disagg_threshold is not None:
        controlplane_args += ["--disagg-threshold", str(args.disagg_threshold)]
    agent_args: list[str] = []
    engine = None
    if external:
        engine, more_controlplane_args = _engine_launch(args)
        controlplane_args += more_controlplane_args
    else:
        if args.model is not None:
            agent_args += ["--model", args.model]
        if args.block_size is not None:
            agent_args += ["--block-size", str(args.block_size)]
    if args.num_blocks is not None:
        agent_args += ["--num-blocks", str(args.num_blocks)]
    # The engine launch gives external agents their --engine with the server's endpoints.
    forwarded = [a for a in args.engine_flags if not (external and a.dest == "engine")]
    agent_args += engine_flags.forward_args(args, forwarded)
    # The servers' packages (and the launcher's, which makes certificates): not in the SDK's base install.
    launcher = import_extra("kvplane.apps.cluster", extra="server,reference", what="kvplane up")
    cluster = launcher.LocalCluster(
        num_prefill=args.prefill, num_decode=args.decode, num_both=args.both, store=args.store,
        port=args.port, agent_args=agent_args, controlplane_args=controlplane_args, log_dir=args.log_dir,
        startup_timeout=args.startup_timeout, num_controlplanes=args.replicas, insecure=args.insecure, engine=engine,
        http_port=None if args.http_port < 0 else args.http_port, bus=args.bus,
    )  # fmt: skip
    supervisor = Supervisor(cluster, RestartPolicy(max_failures=args.max_restarts))
    if args.insecure:
        print("warning: --insecure: the cluster speaks plaintext; prompts and KV cross the network unencrypted", file=sys.stderr)
    previous = _install_stop_handlers()
    try:
        cluster.start()
        _announce(cluster)
        while True:
            for line in supervisor.step(time.monotonic()):
                print(f"kvplane up: {line}", file=sys.stderr, flush=True)
            time.sleep(0.5)
    except _Stop:
        print("stopping the cluster ...", file=sys.stderr, flush=True)
        return 0
    except GaveUp as e:
        raise CliError(f"{e}\nstopping the cluster") from None
    except launcher.ClusterError as e:
        raise CliError(str(e)) from None
    finally:
        _ignore_stop_signals()  # a second Ctrl-C must not abandon children half-stopped
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _engine_launch(args: argparse.Namespace) -> tuple[EngineLaunchConfig, list[str]]:
    """The engine servers' launch config, and the control-plane flags that make the cluster
    refuse any worker of another model or block size."""
    if args.model is None:
        raise CliError(f"--engine {args.engine} needs --model: a local model directory the engine servers load", 2)
    if args.prefill or args.decode:
        raise CliError(
            f"--engine {args.engine} starts plain engine servers (--both); prefill/decode pairs move KV through the "
            "engines' own connectors, which need GPUs and their transfer settings (deploy/gpu-check.sh shows them)", 2
        )  # fmt: skip
    served = Path(args.model).name
    block_size = args.block_size or DEFAULT_ENGINE_BLOCK_SIZE
    try:
        config = EngineLaunchConfig(
            engine=args.engine, model=args.model, block_size=block_size, python=args.engine_python, device=args.engine_device,
            served_model_name=served, extra_args=tuple(args.engine_arg),
        ).validate()  # fmt: skip
    except ValueError as e:
        raise CliError(str(e), 2) from None
    return config, ["--block-size", str(block_size), "--serve-model", served]


def _announce(cluster: LocalCluster) -> None:
    print(f"kvplane cluster ready at {cluster.endpoint}", flush=True)
    if len(cluster.controlplane_endpoints) > 1:
        for name, endpoint in cluster.controlplane_endpoints.items():
            print(f"  {name:<12} {endpoint}")
    for worker_id, endpoint in cluster.worker_endpoints.items():
        engine = cluster.engine_endpoints.get(worker_id)
        print(f"  {worker_id:<12} {endpoint}" + (f"   (engine server {engine})" if engine else ""))
    if cluster.http_url:
        print(f"  {'HTTP API':<12} {cluster.http_url}  (OpenAI-compatible: curl {cluster.http_url}/models)")
        # One line a shell can run as it is: the bearer token (tenant 'local') and, over HTTPS, its CA.
        ca = f" CA={shlex.quote(str(cluster.http_ca))}" if cluster.http_url.startswith("https") else ""
        print(f"  {'':<12} export TOKEN={shlex.quote(cluster.http_token)}{ca}")
    print(f"logs: {cluster.log_dir}")
    if cluster.credentials is not None:
        kind = "plaintext, admin token" if cluster.credentials.insecure else "mutual TLS, throw-away CA and certificates"
        print(f"credentials ({kind}): {cluster.credentials.directory}")
        where = ", ".join(str(cluster_dir(e)) for e in cluster.controlplane_endpoints.values())
        print(f"  clients on this machine find the admin's in {where}")
    print(f"try: KVPLANE_ENDPOINT={cluster.endpoint} kvplane workers    (Ctrl-C stops the cluster)", flush=True)


def _install_stop_handlers() -> dict[int, object]:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        _ignore_stop_signals()
        raise _Stop()

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, on_signal)
    return previous


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
