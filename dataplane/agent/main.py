"""`kvplane agent`: run one agent beside its engine in the foreground (what a sidecar runs)."""

from __future__ import annotations

import argparse
import asyncio
import secrets
import socket
import sys

from kvplane.dataplane import engines
from kvplane.dataplane.agent.config import AgentConfig
from kvplane.security import flags as security_flags
from kvplane.security.credentials import Credentials
from kvplane.telemetry import flags as telemetry_flags
from kvplane.types import Role


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = AgentConfig(worker_id="x")
    parser.add_argument(
        "--worker-id", default="", help="unique worker id, no '/' (default: ROLE-HOSTNAME-PORT, or a random suffix with --port 0)"
    )
    parser.add_argument("--role", choices=[r.value for r in Role], default=a.role.value, help="what this worker does (default %(default)s)")
    parser.add_argument("--host", default=a.host, help="address to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=a.port, help="port to listen on; 0 = any free port (default %(default)s)")
    parser.add_argument("--advertise-host", default="", help="address the control plane and peer agents dial (default: --host)")
    parser.add_argument(
        "--controlplane",
        default=a.controlplane,
        help="control plane host:port, or several replicas comma-separated; the agent fails over between them, with the same "
        "credentials (default %(default)s)",
    )
    parser.add_argument(
        "--engine",
        choices=engines.ENGINE_NAMES,
        default=a.engine_name,
        help="the engine this agent serves (dataplane/engines/); each engine's own flags follow in its group (default %(default)s)",
    )
    parser.add_argument(
        "--hardware",
        default=a.hardware,
        help="what this worker runs on, e.g. 'H100 x4'; workers of one model, KV layout, prefill chunk and hardware are priced "
        "with one step-time model (default: what the engine reports: the reference engine's device, the sim's GPU; vLLM and "
        "SGLang report none)",
    )
    parser.add_argument(
        "--link-gb-per-s",
        type=float,
        default=a.link_gb_per_s,
        help="the rate KV moves at between this worker and its peers, GB/s (e.g. 50 for 400 GbE); the control plane predicts "
        "transfers and prefix fetches with the workers' stated rate until it has measured some (default: what the engine "
        "says: the sim engine its modeled link; otherwise not stated)",
    )
    parser.add_argument("--transports", default="", help="comma-separated KV transports, best first: nixl, grpc (nixl only when it imports and UCX starts) "
                        "(default: all available)")  # fmt: skip
    parser.add_argument(
        "--nixl-progress-delay-us",
        type=int,
        default=a.nixl_progress_delay_us,
        metavar="US",
        help="microseconds NIXL's progress thread waits for UCX events between polls; 0 polls without waiting, as NIXL's "
        "Python wrapper does, and keeps a core busy per agent (default %(default)s)",
    )
    parser.add_argument(
        "--pin-timeout",
        type=float,
        default=a.pin_timeout_s,
        help="seconds a prefilled transfer stays pinned waiting for its pull (default %(default)s)",
    )
    parser.add_argument(
        "--import-wait",
        type=float,
        default=a.import_wait_s,
        metavar="S",
        help="seconds a decode worker whose KV pool is full waits for free blocks to pull a remotely prefilled prompt into "
        "before prefilling it locally (0: at once); keep it under the prefill workers' --pin-timeout (default %(default)s)",
    )
    parser.add_argument(
        "--lease-ttl",
        type=int,
        default=a.lease_ttl_s,
        help="lease TTL in seconds; 0 = the control plane's --lease-ttl (default %(default)s)",
    )
    parser.add_argument("--load-report-interval", type=float, default=a.load_report_interval_s, metavar="S",
                        help="seconds between load reports to the control plane. A report costs the replica that takes it ~0.5 ms of "
                        "CPU (docs/benchmarks.md, the bus): at hundreds of workers raise it (e.g. 1 s for 1,000) and the replicas' "
                        "--stale-report-s with it (about 3x) (default %(default)s)")  # fmt: skip
    parser.add_argument("--count", type=int, default=1, metavar="N",
                        help="run N agents in this process, ids WORKER_ID-0..N-1, ports free or --port + i: a simulated fleet on a "
                        "few cores (--engine sim, whose engines sleep). With TLS, {worker_id} in --tls-cert/--tls-key names each "
                        "agent's files; not with --fault-injection (default %(default)s)")  # fmt: skip
    parser.add_argument(
        "--fault-injection",
        action="store_true",
        help="testing only (the chaos suite): SIGUSR1 drops the next KV event batch, SIGUSR2 cuts the next KV pull served "
        "over gRPC after one chunk",
    )
    for plugin in engines.plugins():
        plugin.add_arguments(parser.add_argument_group(f"--engine {plugin.NAME}", plugin.SUMMARY))
    security_flags.add_server_arguments(parser, controlplane=False)
    telemetry_flags.add_arguments(parser)


def config_from_args(args: argparse.Namespace, certificate_name: str = "") -> AgentConfig:
    """`certificate_name`: the worker id the agent's certificate names, which is then its id."""
    engine = engines.plugin(args.engine).config_from_args(args)
    if certificate_name and args.worker_id and args.worker_id != certificate_name:
        raise ValueError(f"--worker-id {args.worker_id!r} differs from the worker id in the certificate ({certificate_name!r})")
    # Unique by default even for several agents of one role on one host with --port 0.
    worker_id = args.worker_id or certificate_name or f"{args.role}-{socket.gethostname()}-{args.port or secrets.token_hex(3)}"
    return AgentConfig(
        worker_id=worker_id,
        role=Role(args.role),
        host=args.host,
        port=args.port,
        advertise_host=args.advertise_host,
        controlplane=args.controlplane,
        engine_name=args.engine,
        engine=engine,
        transports=tuple(t for t in args.transports.split(",") if t),
        nixl_progress_delay_us=args.nixl_progress_delay_us,
        hardware=args.hardware,
        link_gb_per_s=args.link_gb_per_s,
        lease_ttl_s=args.lease_ttl,
        load_report_interval_s=args.load_report_interval,
        pin_timeout_s=args.pin_timeout,
        import_wait_s=args.import_wait,
        fault_injection=args.fault_injection,
    ).validate()


def agent_from_args(args: argparse.Namespace) -> tuple[AgentConfig, Credentials]:
    """One agent's config and credentials; OSError or ValueError naming the problem (the config's
    own errors first, then missing credentials)."""
    try:
        credentials = security_flags.server_credentials_from_args(args, "the agent")
    except ValueError as e:
        credentials, missing = None, e  # reported after the config's own errors
    else:
        missing = None
    identity = credentials.identity() if credentials is not None else None
    if identity is not None and identity.role.value != "worker":
        raise ValueError(f"the agent's certificate is for {identity}, not a worker")
    config = config_from_args(args, identity.name if identity is not None else "")
    if missing is not None:
        raise missing
    return config, credentials


def run(args: argparse.Namespace) -> int:
    from kvplane import telemetry
    from kvplane.dataplane.agent import host
    from kvplane.dataplane.agent.server import serve

    try:
        if args.count < 1:
            raise ValueError(f"--count must be at least 1, got {args.count}")
        agents = [agent_from_args(args)] if args.count == 1 else host.agents_from_args(args, agent_from_args)
        instance = agents[0][0].worker_id if args.count == 1 else agents[0][0].worker_id.rpartition("-")[0]
        telemetry_config = telemetry_flags.config_from_args(args, "kvplane-agent", instance, agents[0][0].host)
        telemetry.setup(telemetry_config)
    except (OSError, ValueError) as e:  # CredentialsError and IdentityError are ValueErrors
        print(f"kvplane agent: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(*agents[0]) if len(agents) == 1 else host.serve_many(agents))
    except (RuntimeError, ValueError) as e:
        print(f"kvplane agent: {e}", file=sys.stderr)
        return 1
    return 0
