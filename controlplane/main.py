"""`kvplane controlplane`: run one control plane replica in the foreground.

The routing, admission and prediction flags are generated from the planner's config dataclasses
(controlplane/flags.py), so every tunable is a flag and its default is written once."""

from __future__ import annotations

import argparse
import asyncio
import sys

from controlplane.config import ControlPlaneConfig
from controlplane.core.planner import PlannerConfig
from controlplane.flags import add_config_arguments
from controlplane.flags import config_from_args as planner_from_args
from kvplane.telemetry import flags as telemetry_flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = ControlPlaneConfig()
    parser.add_argument("--host", default=d.host, help=f"address to listen on (default {d.host})")
    parser.add_argument("--port", type=int, default=d.port, help=f"port to listen on (default {d.port}; 0 = any free port)")
    parser.add_argument("--store", default=d.store, help="'memory' (embedded, one replica) or etcd://HOST:PORT (default %(default)s)")
    parser.add_argument(
        "--http-port",
        type=int,
        default=d.http_port,
        help="serve the OpenAI-compatible HTTP API on this port (0 = any free port; default: off)",
    )
    parser.add_argument("--lease-ttl", type=int, default=d.lease_ttl_s, help="worker lease TTL in seconds (default %(default)s)")
    add_config_arguments(parser.add_argument_group("routing, admission and prediction"), d.planner)
    telemetry_flags.add_arguments(parser)


def config_from_args(args: argparse.Namespace) -> ControlPlaneConfig:
    planner = planner_from_args(args, PlannerConfig())
    return ControlPlaneConfig(
        host=args.host, port=args.port, store=args.store, lease_ttl_s=args.lease_ttl, http_port=args.http_port, planner=planner
    ).validate()


def run(args: argparse.Namespace) -> int:
    from controlplane.server import serve
    from kvplane import telemetry

    try:
        config = config_from_args(args)
        telemetry_config = telemetry_flags.config_from_args(args, "kvplane-controlplane", f"{config.host}:{config.port}", config.host)
    except ValueError as e:
        print(f"kvplane controlplane: {e}", file=sys.stderr)
        return 2
    try:
        telemetry.setup(telemetry_config)
    except (OSError, ValueError) as e:
        print(f"kvplane controlplane: telemetry: {e}", file=sys.stderr)
        return 2
    asyncio.run(serve(config))
    return 0
