"""`kvplane controlplane`: run one control plane replica in the foreground.

The routing, admission and prediction flags are generated from the planner's config dataclasses
(controlplane/flags.py), so every tunable is a flag and its default is written once."""

from __future__ import annotations

import argparse
import asyncio
import sys

from kvplane.controlplane.config import ControlPlaneConfig
from kvplane.controlplane.core.planner import PlannerConfig
from kvplane.controlplane.flags import add_config_arguments
from kvplane.controlplane.flags import config_from_args as planner_from_args
from kvplane.security import flags as security_flags
from kvplane.telemetry import flags as telemetry_flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = ControlPlaneConfig()
    parser.add_argument("--host", default=d.host, help="address to listen on; 0.0.0.0 for other machines (default %(default)s)")
    parser.add_argument("--port", type=int, default=d.port, help="port to listen on; 0 = any free port (default %(default)s)")
    parser.add_argument("--store", default=d.store,
                        help="'memory' (embedded: one replica, dies with the process), etcd://HOST:PORT, or the members of "
                        "one etcd cluster etcd://H1:P1,H2:P2,... (default %(default)s)")  # fmt: skip
    parser.add_argument("--bus", default=d.bus, metavar="auto|memory|store|nats://HOST:PORT[,...]|tls://HOST:PORT[,...]",
                        help="how workers' load reports and KV events reach every replica: 'memory' (in-process: one replica), "
                        "'store' (keys in the store, a write each), or NATS JetStream (several replicas, large fleets; "
                        "docs/operations.md); 'auto' = memory with the memory store, store with etcd (default %(default)s)")  # fmt: skip
    parser.add_argument(
        "--http-port",
        type=int,
        default=d.http_port,
        help="serve the OpenAI-compatible HTTP API on --host at this port (0 = any free port; default: off); docs/protocol.md",
    )
    parser.add_argument(
        "--lease-ttl",
        type=int,
        default=d.lease_ttl_s,
        help="worker lease TTL in seconds, at least 2; agents renew at a third of it (default %(default)s)",
    )
    faults = parser.add_argument_group("failures")
    faults.add_argument("--max-migrations", type=int, default=d.max_migrations,
                        help="times a request may move to another decode worker mid-stream when its worker fails or stalls "
                        "(0 = never: the caller gets UNAVAILABLE) (default %(default)s)")  # fmt: skip
    faults.add_argument("--first-token-timeout", type=float, default=d.first_token_timeout_s,
                        help="seconds without a first token (queue, prefill and transfer included) before a decode worker counts as "
                        "stalled (default %(default)s)")  # fmt: skip
    faults.add_argument("--token-timeout", type=float, default=d.token_timeout_s,
                        help="seconds without a next token before a decode worker counts as stalled (default %(default)s)")  # fmt: skip
    parser.add_argument("--serve-model", action="append", default=[], metavar="NAME",
                        help="a model this cluster serves (repeatable); a worker serving another is refused at registration "
                        "(FAILED_PRECONDITION) (default: any)")  # fmt: skip
    parser.add_argument("--block-size", type=int, default=d.block_size, metavar="N",
                        help="the KV block size every worker must use; an engine with another is refused at registration "
                        "(default 0: workers of one model must agree with its first)")  # fmt: skip
    parser.add_argument("--tokenizer", action="append", default=[], metavar="[MODEL=]DIR",
                        help="tokenize MODEL's prompts here with DIR's tokenizer.json and chat template (repeatable; without "
                        "MODEL=, every model without its own); needs `pip install 'kvplane[tokenizers]'`. Models whose "
                        "workers use the builtin byte tokenizer need none. Workers never see prompt text (docs/architecture.md, "
                        "Tokenization); relayed answers are detokenized here too, so a model without a tokenizer here has its "
                        "answers' text made by its agents")  # fmt: skip
    parser.add_argument("--trust-worker-cache-claims", action="store_true",
                        help="credit every block a worker's KV events announce, not only those this replica routed to it: "
                        "keeps cache routing across replica restarts, and lets a compromised worker draw traffic with false "
                        "claims; only where every worker is trusted (docs/security.md)")  # fmt: skip
    add_config_arguments(parser.add_argument_group("routing, admission and prediction"), d.planner)
    security_flags.add_server_arguments(parser, controlplane=True)
    etcd = parser.add_argument_group("etcd's own TLS and auth")
    etcd.add_argument("--etcd-ca", default="", metavar="FILE", help="CA of etcd's server certificate (turns on TLS to etcd)")
    etcd.add_argument("--etcd-cert", default="", metavar="FILE", help="client certificate for etcd (its CN is the etcd user)")
    etcd.add_argument("--etcd-key", default="", metavar="FILE", help="its private key")
    etcd.add_argument("--etcd-user", default="", help="etcd user for password auth")
    etcd.add_argument("--etcd-password-file", default="", metavar="FILE", help="file holding that user's password")
    bus = parser.add_argument_group("NATS (a nats:// or tls:// --bus)")
    bus.add_argument("--bus-ca", default="", metavar="FILE", help="CA of NATS's server certificate (default: the system's)")
    bus.add_argument("--bus-cert", default="", metavar="FILE", help="client certificate, where NATS verifies clients")
    bus.add_argument("--bus-key", default="", metavar="FILE", help="its private key")
    bus.add_argument("--bus-for-agents", default="", metavar="nats://HOST:PORT[,...]|tls://HOST:PORT[,...]",
                     help="the same NATS as the agents reach it: registered agents publish their load reports and KV batches there themselves "
                          "instead of through a replica (a replica then only reads them), and every bus message must carry its "
                          "MAC (docs/security.md); needs a NATS that admits the workers (default: agents report over gRPC)")  # fmt: skip
    bus.add_argument("--bus-stream-replicas", type=int, default=d.bus_stream_replicas, metavar="N",
                     help="copies of the bus's JetStream streams in a NATS cluster, set by the first replica that creates "
                     "them (1..5; default %(default)s)")  # fmt: skip
    parser.add_argument("--fault-injection", action="store_true",
                        help="testing only (the chaos suite): SIGUSR1 makes this replica miss the load reports and KV events "
                        "the bus brings it for 2 s")  # fmt: skip
    limits = parser.add_argument_group("limits (docs/security.md)")
    limits.add_argument("--max-workers", type=int, default=d.max_workers, help="registered workers (default %(default)s)")
    limits.add_argument(
        "--max-lease-ttl",
        type=int,
        default=d.max_lease_ttl_s,
        help="longest lease a worker gets in seconds, whatever it asks (default %(default)s)",
    )
    limits.add_argument("--max-blocks-per-worker", type=int, default=d.max_blocks_per_worker,
                        help="blocks the cache index keeps per worker (default %(default)s)")  # fmt: skip
    limits.add_argument(
        "--max-prompt-bytes",
        type=int,
        default=d.max_prompt_bytes,
        help="prompt text size in bytes, checked before tokenization (default %(default)s)",
    )
    limits.add_argument("--rate-limit", type=float, default=d.rate_limit_rps,
                        help="client-API calls per second per identity, 0 = none (default %(default)s)")  # fmt: skip
    limits.add_argument("--rate-burst", type=int, default=d.rate_limit_burst, help="burst above the rate (default %(default)s)")
    limits.add_argument("--http-max-body-bytes", type=int, default=d.http_max_body_bytes,
                        help="largest HTTP request body, 1 KiB..64 MiB; a larger one is refused (413) unread "
                        "(default %(default)s)")  # fmt: skip
    limits.add_argument("--http-body-timeout", type=float, default=d.http_body_timeout_s,
                        help="seconds an HTTP request body may take to arrive (408 after) (default %(default)s)")  # fmt: skip
    limits.add_argument("--grpc-handshake-timeout", type=float, default=d.grpc_handshake_timeout_s,
                        help="seconds a gRPC connection may take from accept to the end of its TLS and HTTP/2 handshake "
                        "(default %(default)s)")  # fmt: skip
    limits.add_argument("--grpc-idle-timeout", type=float, default=d.grpc_idle_timeout_s,
                        help="seconds a gRPC connection may carry no call before it is closed; clients reconnect on their next call "
                        "(default %(default)s)")  # fmt: skip
    limits.add_argument("--grpc-max-connections", type=int, default=d.grpc_max_connections,
                        help="gRPC connections held at once, all peers together (more are closed on accept); keep it under the "
                        "process's file-descriptor limit (default %(default)s)")  # fmt: skip
    limits.add_argument(
        "--ticket-ttl", type=float, default=d.ticket_ttl_s, help="ticket lifetime in seconds, at most 60 (default %(default)s)"
    )
    telemetry_flags.add_arguments(parser)


def config_from_args(args: argparse.Namespace) -> ControlPlaneConfig:
    planner = planner_from_args(args, PlannerConfig())
    return ControlPlaneConfig(
        host=args.host, port=args.port, store=args.store, bus=args.bus, lease_ttl_s=args.lease_ttl, http_port=args.http_port, planner=planner,
        max_migrations=args.max_migrations, first_token_timeout_s=args.first_token_timeout, token_timeout_s=args.token_timeout,
        models=tuple(args.serve_model), block_size=args.block_size, tokenizers=tuple(args.tokenizer),
        trust_worker_cache_claims=args.trust_worker_cache_claims,
        max_workers=args.max_workers, max_lease_ttl_s=max(args.max_lease_ttl, args.lease_ttl),
        max_blocks_per_worker=args.max_blocks_per_worker, max_prompt_bytes=args.max_prompt_bytes,
        rate_limit_rps=args.rate_limit, rate_limit_burst=args.rate_burst, ticket_ttl_s=args.ticket_ttl,
        http_max_body_bytes=args.http_max_body_bytes, http_body_timeout_s=args.http_body_timeout,
        grpc_handshake_timeout_s=args.grpc_handshake_timeout, grpc_idle_timeout_s=args.grpc_idle_timeout,
        grpc_max_connections=args.grpc_max_connections,
        etcd_ca=args.etcd_ca, etcd_cert=args.etcd_cert, etcd_key=args.etcd_key, etcd_user=args.etcd_user,
        etcd_password_file=args.etcd_password_file, bus_ca=args.bus_ca, bus_cert=args.bus_cert, bus_key=args.bus_key,
        bus_stream_replicas=args.bus_stream_replicas, bus_for_agents=args.bus_for_agents,
        fault_injection=args.fault_injection,
    ).validate()  # fmt: skip


def security_from_args(args: argparse.Namespace):
    from kvplane.controlplane.server import ControlPlaneSecurity

    credentials = security_flags.server_credentials_from_args(args, "the control plane")
    return ControlPlaneSecurity(credentials, security_flags.tokens_from_args(args))


def run(args: argparse.Namespace) -> int:
    from kvplane import telemetry
    from kvplane.controlplane.bus import BusUnavailable
    from kvplane.controlplane.server import serve
    from kvplane.controlplane.tokenizer import TokenizerError

    try:
        config = config_from_args(args)
        telemetry_config = telemetry_flags.config_from_args(args, "kvplane-controlplane", f"{config.host}:{config.port}", config.host)
        telemetry.setup(telemetry_config)
        security = security_from_args(args)
    except (OSError, ValueError) as e:  # CredentialsError is a ValueError
        print(f"kvplane controlplane: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(config, security))
    except TokenizerError as e:  # a --tokenizer that cannot be read: refused at start
        print(f"kvplane controlplane: {e}", file=sys.stderr)
        return 2
    except BusUnavailable as e:  # the bus did not answer at start
        print(f"kvplane controlplane: {e}", file=sys.stderr)
        return 1
    return 0
