"""`kvplane agent`: run one agent beside its engine in the foreground (what a sidecar runs)."""
from __future__ import annotations

import argparse
import asyncio
import secrets
import socket

from dataplane.agent.config import AgentConfig
from dataplane.engine.config import EngineConfig
from kvplane.telemetry import flags as telemetry_flags
from kvplane.types import Role


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a, e = AgentConfig(worker_id="x"), EngineConfig()
    parser.add_argument("--worker-id", default="", help="unique worker id (default: ROLE-HOSTNAME-PORT, or a random suffix with --port 0)")
    parser.add_argument("--role", choices=[r.value for r in Role], default=a.role.value, help="what this worker does (default %(default)s)")
    parser.add_argument("--host", default=a.host, help="address to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=a.port, help="port to listen on (default: any free port)")
    parser.add_argument("--advertise-host", default="", help="address peers and the control plane dial (default: --host)")
    parser.add_argument("--controlplane", default=a.controlplane, help="control plane host:port (default %(default)s)")
    parser.add_argument("--model", default=e.model, help="'builtin-tiny' or a local Hugging Face Llama directory (default %(default)s)")
    parser.add_argument("--block-size", type=int, default=e.block_size, help="tokens per KV block (default %(default)s)")
    parser.add_argument("--num-blocks", type=int, default=e.num_blocks, help="KV blocks in the pool (default %(default)s)")
    parser.add_argument("--host-blocks", type=int, default=e.num_host_blocks,
                        help="KV blocks in the host-memory tier, a write-through copy of the device pool (default %(default)s = off)")
    parser.add_argument("--disk-dir", default=e.disk_dir, help="directory of the disk KV tier; its blocks survive restarts (default: off)")
    parser.add_argument("--disk-blocks", type=int, default=e.num_disk_blocks, help="KV blocks kept in the disk tier (default %(default)s)")
    parser.add_argument("--max-num-seqs", type=int, default=e.max_num_seqs, help="largest decode batch (default %(default)s)")
    parser.add_argument("--max-tokens-limit", type=int, default=e.max_tokens_limit, help="largest max_tokens accepted (default %(default)s)")
    parser.add_argument("--dtype", default=e.dtype, help="KV and weight dtype (default %(default)s)")
    parser.add_argument("--device", default=e.device, help="torch device (default %(default)s)")
    parser.add_argument("--seed", type=int, default=e.seed, help="seed of the built-in model's weights and sampling (default %(default)s)")
    parser.add_argument("--transports", default="", help="comma-separated KV transports, best first (default: all available)")
    parser.add_argument("--pin-timeout", type=float, default=a.pin_timeout_s,
                        help="seconds a prefilled transfer stays pinned waiting for its pull (default %(default)s)")
    parser.add_argument("--lease-ttl", type=int, default=a.lease_ttl_s, help="lease TTL in seconds (default: the control plane's)")
    telemetry_flags.add_arguments(parser)


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    engine = EngineConfig(
        model=args.model,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        num_host_blocks=args.host_blocks,
        disk_dir=args.disk_dir,
        num_disk_blocks=args.disk_blocks,
        max_num_seqs=args.max_num_seqs,
        max_tokens_limit=args.max_tokens_limit,
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
    )
    # Unique by default even for several agents of one role on one host with --port 0.
    worker_id = args.worker_id or f"{args.role}-{socket.gethostname()}-{args.port or secrets.token_hex(3)}"
    return AgentConfig(
        worker_id=worker_id,
        role=Role(args.role),
        host=args.host,
        port=args.port,
        advertise_host=args.advertise_host,
        controlplane=args.controlplane,
        engine=engine,
        transports=tuple(t for t in args.transports.split(",") if t),
        lease_ttl_s=args.lease_ttl,
        pin_timeout_s=args.pin_timeout,
    ).validate()


def run(args: argparse.Namespace) -> int:
    from dataplane.agent.server import serve
    from kvplane import telemetry

    try:
        config = config_from_args(args)
        telemetry_config = telemetry_flags.config_from_args(args, "kvplane-agent", config.worker_id, config.host)
    except ValueError as e:
        print(f"kvplane agent: {e}")
        return 2
    try:
        telemetry.setup(telemetry_config)
    except (OSError, ValueError) as e:
        print(f"kvplane agent: telemetry: {e}")
        return 2
    try:
        asyncio.run(serve(config))
    except (RuntimeError, ValueError) as e:
        print(f"kvplane agent: {e}")
        return 1
    return 0
