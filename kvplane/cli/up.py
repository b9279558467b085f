"""`kvplane up`: a control plane and agents as local child processes, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from types import FrameType

from kvplane.cli import engine_flags
from kvplane.cli.common import CliError, non_negative_int, positive_float, positive_int
from kvplane.cluster import ClusterError, LocalCluster

DEFAULT_PORT = 50051  # the SDK's default endpoint, so other commands need no --endpoint
_ETCD_STORE = re.compile(r"^etcd://[^:/\s]+:\d+$")


class _Stop(BaseException):
    """Raised by the signal handler to unwind to the cleanup, wherever the main thread is."""


def register(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser(
        "up",
        help="start a local cluster (control plane + agents) until Ctrl-C",
        description="Starts a control plane and agents as local child processes, prints the endpoint "
        "once every agent has registered, and stops them all on Ctrl-C or SIGTERM.",
    )
    up.add_argument("--prefill", type=non_negative_int, default=1, metavar="N", help="prefill agents (default: 1)")
    up.add_argument("--decode", type=non_negative_int, default=1, metavar="N", help="decode agents (default: 1)")
    up.add_argument("--both", type=non_negative_int, default=0, metavar="N",
                    help="agents that prefill and decode (default: 0)")  # fmt: skip
    up.add_argument("--store", type=store_spec, default="memory", metavar="memory|etcd://HOST:PORT",
                    help="where the control plane keeps shared state (default: memory, embedded)")  # fmt: skip
    up.add_argument("--port", type=positive_int, default=DEFAULT_PORT, metavar="P",
                    help=f"control plane port (default: {DEFAULT_PORT})")  # fmt: skip
    up.add_argument("--http-port", type=http_port_spec, default=0, metavar="P",
                    help="OpenAI-compatible HTTP API port (default: a free port; -1 = off)")  # fmt: skip
    up.add_argument("--disagg-threshold", type=non_negative_int, default=None, metavar="N",
                    help="uncached prompt tokens above which prefill runs remotely (control plane default if unset)")  # fmt: skip
    up.add_argument("--model", default=None, metavar="M", help="model for every agent (agent default if unset)")
    up.add_argument("--num-blocks", type=positive_int, default=None, metavar="N",
                    help="KV blocks per agent (agent default if unset)")  # fmt: skip
    up.add_argument("--log-dir", default=None, metavar="DIR", help="where child logs go (default: a temp dir)")
    up.add_argument("--startup-timeout", type=positive_float, default=120.0, metavar="SECONDS",
                    help="how long to wait for every agent to register (default: 120)")  # fmt: skip
    up.set_defaults(func=run_up, engine_flags=engine_flags.add_arguments(up))


def http_port_spec(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, 0 (any free port) or -1 (off), got {text!r}") from None
    if not -1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number, 0 (any free port) or -1 (off), got {value}")
    return value


def store_spec(text: str) -> str:
    if text == "memory" or _ETCD_STORE.match(text):
        return text
    raise argparse.ArgumentTypeError(f"expected 'memory' or 'etcd://HOST:PORT', got {text!r}")


def run_up(args: argparse.Namespace) -> int:
    if args.prefill + args.decode + args.both == 0:
        raise CliError("nothing to start: give at least one of --prefill, --decode, --both a count > 0", 2)
    controlplane_args: list[str] = []
    if args.disagg_threshold is not None:
        controlplane_args += ["--disagg-threshold", str(args.disagg_threshold)]
    agent_args: list[str] = []
    if args.model is not None:
        agent_args += ["--model", args.model]
    if args.num_blocks is not None:
        agent_args += ["--num-blocks", str(args.num_blocks)]
    agent_args += engine_flags.forward_args(args, args.engine_flags)
    cluster = LocalCluster(
        num_prefill=args.prefill, num_decode=args.decode, num_both=args.both, store=args.store,
        port=args.port, agent_args=agent_args, controlplane_args=controlplane_args, log_dir=args.log_dir,
        startup_timeout=args.startup_timeout, http_port=None if args.http_port < 0 else args.http_port,
    )  # fmt: skip
    previous = _install_stop_handlers()
    try:
        cluster.start()
        _announce(cluster)
        while True:
            exited = cluster.exited()
            if exited:
                name, code = next(iter(exited.items()))
                raise CliError(
                    f"{name} exited unexpectedly with code {code}; stopping the cluster. "
                    f"Last lines of {cluster.log_paths[name]}:\n{cluster.log_tail(name)}"
                )
            time.sleep(0.5)
    except _Stop:
        print("stopping the cluster ...", file=sys.stderr, flush=True)
        return 0
    except ClusterError as e:
        raise CliError(str(e)) from None
    finally:
        _ignore_stop_signals()  # a second Ctrl-C must not abandon children half-stopped
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _announce(cluster: LocalCluster) -> None:
    print(f"kvplane cluster ready at {cluster.endpoint}", flush=True)
    for worker_id, endpoint in cluster.worker_endpoints.items():
        print(f"  {worker_id:<12} {endpoint}")
    if cluster.http_url:
        print(f"  {'HTTP API':<12} {cluster.http_url}  (OpenAI-compatible: curl {cluster.http_url}/models)")
    print(f"logs: {cluster.log_dir}")
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
