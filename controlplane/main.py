"""`kvplane controlplane`: run one control plane replica in the foreground."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses

from controlplane.config import ControlPlaneConfig
from controlplane.core.admission import AdmissionConfig
from controlplane.core.policies import routing_policy_names
from controlplane.core.router import RouterConfig
from kvplane.telemetry import flags as telemetry_flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d, r, a = ControlPlaneConfig(), RouterConfig(), AdmissionConfig()
    parser.add_argument("--host", default=d.host, help=f"address to listen on (default {d.host})")
    parser.add_argument("--port", type=int, default=d.port, help=f"port to listen on (default {d.port}; 0 = any free port)")
    parser.add_argument("--store", default=d.store, help="'memory' (embedded, one replica) or etcd://HOST:PORT (default %(default)s)")
    parser.add_argument("--lease-ttl", type=int, default=d.lease_ttl_s, help="worker lease TTL in seconds (default %(default)s)")
    parser.add_argument("--disagg-threshold", type=int, default=r.disagg_threshold_tokens,
                        help="remote prefill only when a prompt's uncached tokens reach this (default %(default)s)")
    parser.add_argument("--prefill-load-scale", type=float, default=r.prefill_load_scale, help="router weight of prefill work (default %(default)s)")
    parser.add_argument("--routing-policy", default=r.policy, choices=routing_policy_names(),
                        help="which decode worker takes a request (default %(default)s)")
    parser.add_argument("--prediction-ttl", type=float, default=r.prediction_ttl_s,
                        help="kvplane policy: seconds a routed prefix counts as cached before its KV events arrive (default %(default)s)")
    parser.add_argument("--guard-ratio", type=float, default=r.guard_ratio,
                        help="kvplane policy: cache credit decays above this multiple of the pool's mean load (0 = off; default %(default)s)")
    parser.add_argument("--fetch-min-blocks", type=int, default=r.fetch_min_blocks,
                        help="kvplane policy: fetch a cached prefix from a busier holder when it brings this many blocks (0 = off; default %(default)s)")
    parser.add_argument("--admission", default=a.policy, help="admission policy: threshold or none (default %(default)s)")
    parser.add_argument("--max-running", type=int, default=a.max_running, help="threshold admission: running requests per worker (default %(default)s)")
    parser.add_argument("--max-waiting", type=int, default=a.max_waiting, help="threshold admission: waiting requests per worker (default %(default)s)")
    parser.add_argument("--max-queued-prefill-tokens", type=int, default=a.max_queued_prefill_tokens,
                        help="threshold admission: queued prefill tokens per worker (default %(default)s)")
    telemetry_flags.add_arguments(parser)


def config_from_args(args: argparse.Namespace) -> ControlPlaneConfig:
    router = dataclasses.replace(
        RouterConfig(),
        policy=args.routing_policy,
        disagg_threshold_tokens=args.disagg_threshold,
        prefill_load_scale=args.prefill_load_scale,
        prediction_ttl_s=args.prediction_ttl,
        guard_ratio=args.guard_ratio,
        fetch_min_blocks=args.fetch_min_blocks,
    )
    admission = dataclasses.replace(
        AdmissionConfig(),
        policy=args.admission,
        max_running=args.max_running,
        max_waiting=args.max_waiting,
        max_queued_prefill_tokens=args.max_queued_prefill_tokens,
    )
    return ControlPlaneConfig(
        host=args.host, port=args.port, store=args.store, lease_ttl_s=args.lease_ttl, router=router, admission=admission
    ).validate()


def run(args: argparse.Namespace) -> int:
    from controlplane.server import serve
    from kvplane import telemetry

    try:
        config = config_from_args(args)
        telemetry_config = telemetry_flags.config_from_args(args, "kvplane-controlplane", f"{config.host}:{config.port}", config.host)
    except ValueError as e:
        print(f"kvplane controlplane: {e}")
        return 2
    try:
        telemetry.setup(telemetry_config)
    except (OSError, ValueError) as e:
        print(f"kvplane controlplane: telemetry: {e}")
        return 2
    asyncio.run(serve(config))
    return 0
