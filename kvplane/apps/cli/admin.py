"""Admin commands: `kvplane workers`, `kvplane cache`, `kvplane drain WORKER_ID` (`--undo` to undrain),
`kvplane wait` (until a starting cluster serves: what a script runs after `kvplane up ... &`)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from kvplane.apps.cli.common import (
    EXIT_UNAVAILABLE,
    CliError,
    client_parent,
    connect,
    format_table,
    json_flag,
    non_negative_int,
    positive_float,
    print_json,
)
from kvplane.client import WorkerCache, WorkerState, WorkerStatus
from kvplane.errors import UnavailableError

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

    wait = subparsers.add_parser(
        "wait", parents=[parent], help="wait until the control plane answers with enough active workers",
        description="Waits until the control plane answers and lists at least --workers active workers, then exits 0; "
        "exits 5 (unavailable) if that has not happened within --within seconds. For scripts: `kvplane up ... &` "
        "then `kvplane wait`. Credentials that `kvplane up` has not published yet count as not ready.",
    )  # fmt: skip
    wait.add_argument("--workers", type=non_negative_int, default=1, metavar="N", help="active workers to wait for (default 1)")
    wait.add_argument("--within", type=positive_float, default=120.0, metavar="SECONDS", help="give up after this long (default 120)")
    wait.set_defaults(func=run_wait)


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
            f"{w.load_age_s:.1f}s", w.out_of_routing or "-",
        )
        for w in workers
    ]  # fmt: skip
    print(format_table(("ID", "ROLE", "STATE", "ENDPOINT", "MODEL", "RUNNING", "WAITING", "BLOCKS", "LOAD AGE", "OUT OF ROUTING"), rows))
    return 0


_WAIT_POLL_S = 0.25


def run_wait(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.within
    seen = "the control plane did not answer"
    while True:
        try:
            with connect(args, timeout=max(0.5, min(5.0, deadline - time.monotonic()))) as client:
                active = sum(w.state is WorkerState.ACTIVE for w in client.workers())
            if active >= args.workers:
                return 0
            seen = f"{active} of {args.workers} workers active"
        except (CliError, UnavailableError) as e:  # not started yet, or its credentials not published yet
            seen = str(e)
        if time.monotonic() >= deadline:
            raise CliError(f"not ready after {args.within:g} s: {seen}", EXIT_UNAVAILABLE)
        time.sleep(_WAIT_POLL_S)


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
        "out_of_routing": w.out_of_routing,
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
