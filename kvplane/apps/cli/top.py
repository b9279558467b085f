"""`kvplane top`: a live view of the workers: role, load, KV use per tier, cache hits, TTFT/ITL.

Each refresh asks the control plane three things: ListWorkers (role, state, reported load),
GetCache (blocks per tier in the cache index) and GetStats (per-worker percentiles over the
recent requests this replica ran; with several replicas, each knows only its own requests).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any

from kvplane.apps.cli.common import client_parent, connect, format_table, positive_float
from kvplane.client import Client

_TIERS = ("device", "host", "disk")


def register(subparsers: argparse._SubParsersAction) -> None:
    top = subparsers.add_parser(
        "top", parents=[client_parent()], help="live view of workers, load, KV tiers, cache hits, TTFT/ITL",
        description="Shows every worker's role, load, KV use per tier, prefix-cache hit rate and recent "
        "TTFT/ITL percentiles, refreshing until Ctrl-C.",
    )  # fmt: skip
    top.add_argument("--json", action="store_true", help="print snapshots as JSON (one per line unless --once)")
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.add_argument("--interval", type=positive_float, default=1.0, metavar="SECONDS", help="refresh period (default: 1)")
    top.add_argument("--window", type=positive_float, default=60.0, metavar="SECONDS",
                     help="percentiles over the requests of the last SECONDS (default: 60)")  # fmt: skip
    top.set_defaults(func=run_top)


def snapshot(client: Client, window_s: float) -> dict[str, Any]:
    workers, caches, stats = client.workers(), client.cache(), client.stats(window_s)
    tiers_of = {c.worker_id: c.blocks_by_tier for c in caches}
    stats_of = {s.worker_id: s for s in stats.workers}
    rows = []
    for w in workers:
        s = stats_of.get(w.worker_id)
        load = w.load
        rows.append({
            "id": w.worker_id,
            "role": w.role.value if w.role else "unspecified",
            "state": w.state.value,
            "endpoint": w.endpoint,
            "metrics_url": w.metrics_url,
            "load": {"running": load.num_running, "waiting": load.num_waiting, "queued_prefill_tokens": load.num_queued_prefill_tokens},
            "kv": {
                "used_blocks": load.num_used_blocks,
                "cached_blocks": load.num_cached_blocks,
                "total_blocks": load.num_total_blocks,
                "use": load.num_used_blocks / load.num_total_blocks if load.num_total_blocks else 0.0,
                "indexed_blocks_by_tier": {t: tiers_of.get(w.worker_id, {}).get(t, 0) for t in _TIERS},
            },
            "requests": s.num_requests if s else 0,
            "prompt_tokens": s.prompt_tokens if s else 0,
            "cached_tokens": s.cached_tokens if s else 0,
            "cache_hit_rate": s.cache_hit_rate if s else 0.0,
            "kv_transfer_bytes": s.kv_transfer_bytes if s else 0,
            "ttft_ms": _summary(s.ttft) if s else _summary(None),
            "itl_ms": _summary(s.itl) if s else _summary(None),
        })  # fmt: skip
    return {
        "endpoint": client.endpoint,
        "time": time.time(),
        "window_s": stats.window_s,
        "controlplane_metrics_url": stats.metrics_url,
        "workers": rows,
    }


def _summary(s) -> dict[str, float]:
    if s is None:
        return {"count": 0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    return {"count": s.count, "p50": s.p50_ms, "p90": s.p90_ms, "p99": s.p99_ms}


def _ms(summary: dict[str, float]) -> str:
    if not summary["count"]:
        return "-"
    return f"{summary['p50']:.1f}/{summary['p99']:.1f}"


def render(snap: dict[str, Any]) -> str:
    header = (
        f"kvplane top  {snap['endpoint']}  {time.strftime('%H:%M:%S', time.localtime(snap['time']))}  "
        f"window {snap['window_s']:.0f}s  control plane metrics {snap['controlplane_metrics_url'] or '-'}"
    )
    if not snap["workers"]:
        return header + "\n\nno workers registered"
    rows = []
    for w in snap["workers"]:
        kv, tiers = w["kv"], w["kv"]["indexed_blocks_by_tier"]
        rows.append((
            w["id"], w["role"], w["state"], w["load"]["running"], w["load"]["waiting"],
            f"{kv['used_blocks']}/{kv['total_blocks']} ({kv['use']:.0%})",
            tiers["device"], tiers["host"], tiers["disk"],
            f"{w['cache_hit_rate']:.0%}" if w["prompt_tokens"] else "-",
            w["requests"], _ms(w["ttft_ms"]), _ms(w["itl_ms"]),
        ))  # fmt: skip
    table = format_table(
        ("WORKER", "ROLE", "STATE", "RUN", "WAIT", "KV USED", "DEVICE", "HOST", "DISK", "HIT", "REQS", "TTFT p50/p99 ms", "ITL p50/p99 ms"),
        rows,
    )
    return f"{header}\n\n{table}\n\nDEVICE/HOST/DISK: blocks in the cache index per tier; HIT: prompt tokens found cached"


def run_top(args: argparse.Namespace) -> int:
    interactive = sys.stdout.isatty() and not args.json and not args.once
    # Ctrl-C ends the loop between refreshes, never inside a gRPC call: a KeyboardInterrupt raised
    # there can leave the channel's close waiting for ever (gRPC Python's known hang, grpc/grpc#19973;
    # seen once in the suite: `kvplane top` still running 30 s after SIGINT on a loaded machine).
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    try:
        with connect(args, timeout=args.timeout or 5.0) as client:
            while not interrupted.is_set():
                snap = snapshot(client, args.window)
                if interrupted.is_set():  # during the calls: no refresh after it
                    break
                if args.json:
                    print(json.dumps(snap, indent=2 if args.once else None), flush=True)
                else:
                    # Home the cursor and clear, so the view refreshes in place.
                    print(("\x1b[H\x1b[2J" if interactive else "") + render(snap), flush=True)
                if args.once:
                    return 0
                interrupted.wait(args.interval)
    finally:
        signal.signal(signal.SIGINT, previous)
    raise KeyboardInterrupt  # the CLI's usual way out: "kvplane: interrupted", exit status 130
