"""`kvplane bench index`: what keeping the cache index costs the control plane per worker.

Every agent publishes its KV events and, every `kv_snapshot_interval_s` (10 s), a full snapshot of
its blocks, which repairs whatever a lost batch left out. Each replica applies every one of them
(controlplane/core/index.py). In one process, no sockets: `--workers` workers, each holding
`--blocks` chained block hashes on the device, registered by a first snapshot; then rounds in
which each worker turns `--turnover` of its blocks over (its oldest dropped, new ones stored) and
that change reaches the index two ways, timed separately on two copies of the index:

- as events: a batch removing the dropped blocks and storing the new ones;
- as the periodic snapshot that follows it: every block the worker holds.

A snapshot is applied as a difference (only the blocks it adds or drops are written); the first
snapshot of a worker (registration), which stores every block, is the baseline in the same run:
before snapshots were applied as differences every periodic snapshot cost one of those plus
clearing the worker first. The last column projects the cores one replica spends on periodic
snapshots for 1,000 workers of this size (1,000 / interval snapshots a second).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from kvplane.block_hash import hash_blocks
from kvplane.controlplane.core.index import CacheIndex, RemovedEvent, StoredEvent
from kvplane.stats import percentile
from kvplane.types import Tier, WorkerId

MODEL = "bench-model"
BLOCK_SIZE = 16
PROMPT_BLOCKS = 256  # a 4,096-token prompt: one chain of hashes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=16, help="workers in the index (default %(default)s)")
    parser.add_argument("--blocks", type=int, default=8192, help="device blocks each worker holds (default %(default)s)")
    parser.add_argument("--turnover", type=float, default=0.01, help="share of a worker's blocks replaced between two snapshots (default %(default)s)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="periodic snapshots per worker (default %(default)s)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between a worker's snapshots, for the projection (default %(default)s: the agent's)")  # fmt: skip
    parser.add_argument("--credit-routed-only", action=argparse.BooleanOptionalAction, default=True,
                        help="the index's credit rule, as the control plane runs it (default on)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def _prompts(rng: random.Random, num_blocks: int) -> list:
    """`num_blocks` new chained block hashes, in prompts of PROMPT_BLOCKS blocks."""
    out: list = []
    while len(out) < num_blocks:
        out += hash_blocks([rng.randrange(32000) for _ in range(PROMPT_BLOCKS * BLOCK_SIZE)], BLOCK_SIZE, model_salt=MODEL)
    return out[:num_blocks]


def run(args: argparse.Namespace) -> int:
    if args.workers < 1 or args.blocks < 1 or not 0 < args.turnover <= 1 or args.rounds < 1 or args.interval <= 0:
        print("kvplane bench index: --workers, --blocks, --rounds and --interval must be positive, 0 < --turnover <= 1", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    workers = [WorkerId(f"w{i:04d}") for i in range(args.workers)]
    by_snapshot, by_events = CacheIndex(args.credit_routed_only), CacheIndex(args.credit_routed_only)
    held: dict[WorkerId, list] = {}
    first: list[float] = []
    print(f"registering {args.workers} workers x {args.blocks} blocks ...", file=sys.stderr, flush=True)
    for w in workers:
        held[w] = _prompts(rng, args.blocks)
        for index in (by_snapshot, by_events):
            index.vouch(w, held[w])  # the control plane routed these blocks there (the credit rule)
            started = time.perf_counter()
            index.apply_snapshot(w, 0, {Tier.DEVICE: held[w]})
            if index is by_snapshot:
                first.append(time.perf_counter() - started)
    events: list[float] = []
    periodic: list[float] = []
    num_changed = max(1, round(args.blocks * args.turnover))
    for round_ in range(1, args.rounds + 1):
        print(f"  round {round_}/{args.rounds}: {num_changed} blocks turned over per worker ...", file=sys.stderr, flush=True)
        for w in workers:
            new = _prompts(rng, num_changed)
            dropped, held[w] = held[w][:num_changed], held[w][num_changed:] + new
            for index in (by_snapshot, by_events):
                index.vouch(w, new)
            batch = [RemovedEvent(tuple(dropped), Tier.DEVICE), StoredEvent(tuple(new), Tier.DEVICE)]
            started = time.perf_counter()
            by_events.apply_batch(w, round_, batch)
            events.append(time.perf_counter() - started)
            started = time.perf_counter()
            by_snapshot.apply_snapshot(w, round_, {Tier.DEVICE: held[w]})
            periodic.append(time.perf_counter() - started)
    if by_snapshot.blocks_by_tier() != by_events.blocks_by_tier():  # both ways must say the same
        print("kvplane bench index: the snapshots and the events left different indexes", file=sys.stderr)
        return 1
    base = percentile(first, 50)
    rows = []
    for name, seconds, blocks in (
        ("first snapshot (registration)", first, args.blocks),
        ("events of the turnover", events, 2 * num_changed),
        ("periodic snapshot", periodic, args.blocks),
    ):
        p50 = percentile(seconds, 50)
        rows.append({
            "what": name, "count": len(seconds), "blocks": blocks, "p50_ms": p50 * 1e3, "p99_ms": percentile(seconds, 99) * 1e3,
            "us_per_block": p50 / blocks * 1e6, "ratio_to_first": p50 / base,
            "cores_at_1000_workers": p50 * 1000 / args.interval if name == "periodic snapshot" else None,
        })  # fmt: skip
    if args.json:
        print(json.dumps({"workers": args.workers, "blocks": args.blocks, "turnover": args.turnover, "rows": rows}))
        return 0
    print(f"applying a worker's KV state to the index: {args.blocks} blocks per worker, {args.turnover:.1%} turned over between snapshots")
    print(f"{'what':<31} {'count':>6} {'blocks':>7} {'p50 ms':>8} {'p99 ms':>8} {'us/block':>9} {'x first':>8} {'cores@1000':>11}")
    for r in rows:
        cores = "-" if r["cores_at_1000_workers"] is None else f"{r['cores_at_1000_workers']:.3f}"
        print(f"{r['what']:<31} {r['count']:>6} {r['blocks']:>7} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['us_per_block']:>9.3f} "
              f"{r['ratio_to_first']:>8.3f} {cores:>11}")  # fmt: skip
    print(
        f"x first = p50 over the first snapshot's; cores@1000 = a replica's cores for 1,000 such workers, one snapshot each every {args.interval:g} s"
    )
    return 0
