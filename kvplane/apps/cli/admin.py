"""Admin commands: `kvplane workers`, `kvplane cache`, `kvplane drain WORKER_ID` (`--undo` to undrain)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from kvplane.apps.cli.common import client_parent, connect, format_table, json_flag, print_json
from kvplane.client import WorkerCache, WorkerStatus

_TIERS = ("device", "host", "disk")


def register(subparsers: argparse._SubParsersAction) -> None:
    parent = client_parent()
    workers = subparsers.add_parser(
        "workers", parents=[parent], help="list registered workers and their load",
        description="Lists the workers the control plane knows, with role, state and last reported load.",
    )  # fmt: skip
    json_flag(workers)
    workers.set_defaults(func=run_workers)

    cache = subparsers.add_parser(
        "cache", parents=[parent], help="show cached KV blocks per worker and tier",
        description="Shows how many KV blocks the cache index holds per worker and tier (device, host, disk), and the "
        "blocks each worker holds pinned for KV transfers (0 once traffic stops).",
    )  # fmt: skip
    json_flag(cache)
    cache.set_defaults(func=run_cache)

    drain = subparsers.add_parser(
        "drain", parents=[parent], help="stop routing new requests to a worker (--undo: route to it again)",
        description="Marks a worker as draining: it gets no new requests; running ones finish. "
        "With --undo, returns a drained worker to routing.",
    )  # fmt: skip
    drain.add_argument("worker_id", metavar="WORKER_ID", help="the worker to drain (see `kvplane workers`)")
    drain.add_argument("--undo", action="store_true", help="undrain: the worker takes new requests again")
    json_flag(drain)
    drain.set_defaults(func=run_drain)


def run_workers(args: argparse.Namespace) -> int:
    with connect(args) as client:
        workers = client.workers()
    if args.json:
        print_json([worker_to_json(w) for w in workers])
        return 0
    if not workers:
        print("no workers registered")
        return 0
    rows = [
        (
            w.worker_id, w.role.value if w.role else "?", w.state.value, w.endpoint, w.model or "-",
            w.load.num_running, w.load.num_waiting, f"{w.load.num_used_blocks}/{w.load.num_total_blocks}",
            f"{w.load_age_s:.1f}s",
        )
        for w in workers
    ]  # fmt: skip
    print(format_table(("ID", "ROLE", "STATE", "ENDPOINT", "MODEL", "RUNNING", "WAITING", "BLOCKS", "LOAD AGE"), rows))
    return 0


def worker_to_json(w: WorkerStatus) -> dict[str, Any]:
    return {
        "id": w.worker_id,
        "role": w.role.value if w.role else "unspecified",
        "endpoint": w.endpoint,
        "state": w.state.value,
        "model": w.model,
        "layout": dataclasses.asdict(w.layout) if w.layout else None,
        "max_context": w.max_context,
        "vocab_size": w.vocab_size,
        "transports": list(w.transports),
        "max_tokens_limit": w.max_tokens_limit,
        "load": dataclasses.asdict(w.load),
        "load_age_s": w.load_age_s,
        "metrics_url": w.metrics_url,
    }


def run_cache(args: argparse.Namespace) -> int:
    with connect(args) as client:
        caches = client.cache()
    if args.json:
        print_json([cache_to_json(c) for c in caches])
        return 0
    if not caches:
        print("no cached blocks reported")
        return 0
    extra_tiers = sorted({t for c in caches for t in c.blocks_by_tier} - set(_TIERS))
    tiers = (*_TIERS, *extra_tiers)
    rows = [
        (c.worker_id, *(c.blocks_by_tier.get(t, 0) for t in tiers), sum(c.blocks_by_tier.values()), c.num_pinned_blocks) for c in caches
    ]
    print(format_table(("WORKER", *(t.upper() for t in tiers), "TOTAL", "PINNED"), rows))
    return 0


def cache_to_json(c: WorkerCache) -> dict[str, Any]:
    return {"id": c.worker_id, "blocks_by_tier": dict(c.blocks_by_tier), "pinned_blocks": c.num_pinned_blocks}


def run_drain(args: argparse.Namespace) -> int:
    with connect(args) as client:
        result = client.undrain(args.worker_id) if args.undo else client.drain(args.worker_id)
    if args.json:
        print_json({"id": result.worker_id, "state": result.state.value})
    else:
        print(f"worker {result.worker_id} is {result.state.value}")
    return 0
