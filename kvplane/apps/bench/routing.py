"""`kvplane bench routing`: what routing one request costs the control plane as the fleet grows.

In one process, no sockets: the real planner (router, kvplane policy, admission, predictions, load
ledger) over a fleet of plain worker views and a cache index filled to `--blocks-per-worker` per
worker. Requests arrive every millisecond of the planner's clock, and every worker reports a new
load every `--report-interval` seconds of it, in turn (the store's watch; not timed); the timed part is what the control plane does for the request: its view
updated with those reports (core/pool.cluster_with, as ClusterState.view() does) and
`Planner.plan` (hash, index lookup, pricing, placement, admission). Each request is then
dispatched, so predicted prefixes and ledger entries build up as in a running control plane;
requests finish after `--in-flight` later ones, each having measured what was predicted (honest
workers: the calibration and every worker's report trust learn from it, as on a control plane). Timing starts after `--warm-up` seconds of the
planner's clock (6 s: predicted prefixes, 5 s TTL, have begun to expire, one per request, and
the ledger holds what reports have not shown yet): the steady state of a busy control plane,
which costs ~15-20 % more per request than the first few hundred requests do. The garbage
collector is set as the control plane sets it (controlplane/gc_tuning.py).

Three fleets: `spread` (three workers in ten hold a random part of one of 16 hot prompts beside
their own blocks: about twenty holders per prompt at 1,000 workers), `hot-prefix` (every worker
holds the first 64 blocks of one of the 16 prompts: about 60 holders per prompt at 1,000 workers,
each matching as much as the others) and `system-prompt` (the 16 prompts begin with the same 64
blocks, a shared system prompt, and every worker holds them: the whole fleet holds the same
prefix of every request). Two admission policies: threshold (reads loads) and predictive (predicts
latencies). The baseline, measured in the same run, prices every worker
(`--max-uncached-candidates 0`); the default prices, of the workers matching the same number of
the prompt's blocks, the 16 least loaded by each key of the pruning (seconds.py), the only ones
that can win. `B/block` is the memory the fleet's
build allocates and keeps (tracemalloc: the cache index with its keys and per-worker sets, and
the worker views) per indexed block. `--passes N` routes the same requests N times and keeps each
request's least time: on a shared machine another process's pauses move a row's p99 by more
than a change to the code does, and the least of a few passes shows what the code costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
import tracemalloc

from kvplane.block_hash import hash_blocks
from kvplane.controlplane import gc_tuning
from kvplane.controlplane.core.index import CacheIndex
from kvplane.controlplane.core.planner import Outcome, Plan, Planner, PlannerConfig
from kvplane.controlplane.core.pool import cluster_with
from kvplane.controlplane.core.router import RouterConfig
from kvplane.controlplane.core.routing import RouteRequest
from kvplane.controlplane.core.settings import ClusterSettings
from kvplane.controlplane.core.views import ClusterView, WorkerLoadView, WorkerView
from kvplane.latency import StepTimeModel
from kvplane.stats import percentile
from kvplane.types import DisaggMode, Role, Tier, WorkerId

MODEL = "bench-model"
BLOCK_SIZE = 16
NUM_HOT_PROMPTS = 16
HOT_PREFIX_BLOCKS = 64
REQUEST_INTERVAL_S = 0.001  # the planner's clock between two requests: 1,000 requests/s
# A step-time model of a large GPU worker (seconds): predictions cost what real ones cost.
LATENCY = StepTimeModel((0.008, 2e-5, 1e-9, 3e-4, 2e-7), num_samples=100, mean_abs_pct_error=0.05)
FLEETS = ("spread", "hot-prefix", "system-prompt")
ADMISSIONS = ("threshold", "predictive")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", default="100,1000", help="comma-separated fleet sizes (default %(default)s)")
    parser.add_argument("--blocks-per-worker", type=int, default=1000, help="indexed blocks per worker (default %(default)s)")
    parser.add_argument("--prompt-tokens", type=int, default=4096, help="prompt length (default %(default)s)")
    parser.add_argument("--requests", type=int, default=200, help="measured requests per row (default %(default)s)")
    parser.add_argument("--in-flight", type=int, default=64, help="requests dispatched and not yet finished (default %(default)s)")
    parser.add_argument(
        "--fleets", default=",".join(FLEETS), help="comma-separated: spread, hot-prefix, system-prompt (default %(default)s)"
    )
    parser.add_argument("--admissions", default=",".join(ADMISSIONS), help="comma-separated admission policies (default %(default)s)")
    parser.add_argument(
        "--report-interval", type=float, default=1.0, metavar="S",
        help="seconds between two load reports of a worker, at 1,000 requests/s; the planner takes reports as fresh for 3x this (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--warm-up", type=float, default=6.0, metavar="S",
        help="seconds of the planner's clock (1,000 requests each) routed before timing starts; at least --in-flight requests (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--no-baseline", action="store_true",
        help="skip the baseline (every worker priced): half the time, and the only routing in the process (to count its instructions)",
    )  # fmt: skip
    parser.add_argument(
        "--no-memory", action="store_true", help="skip measuring bytes per indexed block (tracemalloc makes each fleet's build ~5x slower)"
    )
    parser.add_argument(
        "--passes", type=int, default=1, metavar="N",
        help="route the same requests N times (each pass from a fresh planner, making the same decisions) and keep each "
        "request's least time: what the code costs, without the pauses other processes cause on a shared machine (default %(default)s)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def random_load(rng: random.Random) -> WorkerLoadView:
    """A busy worker's load report."""
    return WorkerLoadView(
        num_running=rng.randrange(0, 32), num_waiting=rng.randrange(0, 4), num_queued_prefill_tokens=rng.randrange(0, 16384),
        num_free_blocks=4000, num_used_blocks=rng.randrange(0, 4000), num_total_blocks=8000,
        running_remaining_tokens=tuple(rng.randrange(1, 512) for _ in range(16)), running_context_tokens=40000,
    )  # fmt: skip


def fleet_prompts(fleet: str, prompts: list[list[int]]) -> list[list[int]]:
    """The prompts a fleet is asked: for `system-prompt`, each begins with the first prompt's
    first HOT_PREFIX_BLOCKS blocks."""
    if fleet != "system-prompt":
        return prompts
    shared = prompts[0][: HOT_PREFIX_BLOCKS * BLOCK_SIZE]
    return [shared + p[len(shared) :] for p in prompts]


def build_fleet(num_workers: int, blocks_per_worker: int, fleet: str, prompts: list[list[int]], rng: random.Random):
    """(worker views, cache index) for one fleet shape, asked `fleet_prompts(fleet, prompts)`."""
    prompts = fleet_prompts(fleet, prompts)
    index = CacheIndex()
    hot = [hash_blocks(p, BLOCK_SIZE, model_salt=MODEL, tenant_salt="") for p in prompts]
    workers = []
    for i in range(num_workers):
        worker_id = WorkerId(f"w{i:04d}")
        prompt = hot[rng.randrange(len(hot))]
        if fleet in ("hot-prefix", "system-prompt"):
            held = list(prompt[:HOT_PREFIX_BLOCKS])
        else:
            held = list(prompt[: rng.randrange(0, len(prompt))]) if rng.random() < 0.3 else []
        held += [rng.getrandbits(63).to_bytes(8, "big") for _ in range(blocks_per_worker - len(held))]
        index.apply_snapshot(worker_id, 0, {Tier.DEVICE: held})
        load = random_load(rng)
        role = Role.PREFILL if i % 4 == 0 else Role.BOTH
        workers.append(
            WorkerView(worker_id, role, MODEL, BLOCK_SIZE, True, load, 131072, block_nbytes=BLOCK_SIZE * 327680, latency=LATENCY)
        )
    return tuple(workers), index


def least_of_passes(workers, index, prompts, admission: str, max_uncached: int, args) -> list[float]:
    """`measure`'s seconds per request, each request's least over `args.passes` passes (every pass
    the same requests from a fresh planner: an error if their decisions differ)."""
    passes = [measure(workers, index, prompts, admission, max_uncached, args, random.Random(args.seed)) for _ in range(args.passes)]
    if any(choices != passes[0][1] for _, choices in passes[1:]):
        raise RuntimeError("the passes decided differently: their times are not of the same work")
    return [min(times) for times in zip(*(seconds for seconds, _ in passes))]


def measure(workers, index, prompts, admission: str, max_uncached: int, args, rng: random.Random) -> tuple[list[float], list]:
    """(seconds per request, each request's placement or rejection) of `args.requests` requests
    (after the warm-up): the control plane's view updated with the load reports that arrived
    since the last request, as ClusterState.view() does, then Planner.plan."""
    config = PlannerConfig(
        router=RouterConfig(max_uncached_candidates=max_uncached), admission_policy=admission, stale_report_s=3 * args.report_interval
    )
    planner = Planner(config, random.Random(args.seed))
    now = 1000.0
    workers = staggered(workers, now, args.report_interval)
    cluster = ClusterView(tuple(workers), index)
    settings = ClusterSettings()
    in_flight: list[tuple[int, Outcome]] = []
    seconds, choices = [], []
    reporting = 0  # workers report in turn, each every report_interval
    warm_up = num_warm_up(args)
    for n in range(warm_up + args.requests):
        prompt = prompts[rng.randrange(len(prompts))]
        tail = [rng.randrange(32000) for _ in range(BLOCK_SIZE)]  # a user's own turn after the shared part
        request = RouteRequest(MODEL, prompt[: args.prompt_tokens - len(tail)] + tail, 256, DisaggMode.AUTO)
        now += REQUEST_INTERVAL_S
        reports = {}  # what the store's watch delivered since the last request (not timed: not routing's work)
        while workers[reporting].reported_at + args.report_interval <= now:
            w = workers[reporting] = dataclasses.replace(workers[reporting], load=random_load(rng), reported_at=now)
            reports[w.worker_id] = w
            planner.load_reported(w.worker_id, now)
            reporting = (reporting + 1) % len(workers)
        started = time.perf_counter()
        if reports:
            cluster = cluster_with(cluster, reports, None)
        plan = planner.plan(request, cluster, settings, now)
        elapsed = time.perf_counter() - started
        if n >= warm_up:
            seconds.append(elapsed)
            choices.append((plan.decode_worker, plan.prefill_worker) if isinstance(plan, Plan) else None)
        if isinstance(plan, Plan):  # not a Reject
            in_flight.append((planner.dispatched(plan, now), as_predicted(plan)))
        if len(in_flight) > args.in_flight:
            dispatch_id, outcome = in_flight.pop(0)
            planner.finished(dispatch_id, now, outcome)
    return seconds, choices


def as_predicted(plan: Plan) -> Outcome:
    """What an honest worker measures: the prediction before the planner's calibration."""
    p = plan.prediction
    if p is None:
        return Outcome()
    return Outcome(ttft_s=p.ttft_s - p.ttft_offset_s, tpot_s=p.tpot_s - p.tpot_offset_s)


def staggered(workers: list[WorkerView], now: float, interval: float) -> list[WorkerView]:
    """The workers with report times staggered in the order they report in (the bench's loop goes
    0, 1, 2, ...): worker i's next report falls due i / len(workers) of an interval after `now`,
    so one lands every interval / len(workers), never the whole fleet at once."""
    n = len(workers)
    return [dataclasses.replace(w, reported_at=now - interval * (n - i) / n) for i, w in enumerate(workers)]


def num_warm_up(args: argparse.Namespace) -> int:
    """Requests routed before timing starts."""
    return max(args.in_flight, round(args.warm_up / REQUEST_INTERVAL_S))


def reference_loop_ms() -> float:
    """How fast this machine runs Python right now: the best of three 1,000,000-step loops, ms.
    A shared machine's speed drifts (up to 1.8x here within minutes); compare runs through it."""
    best = float("inf")
    for _ in range(3):
        started, total = time.perf_counter(), 0
        for i in range(1_000_000):
            total += i
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def run(args: argparse.Namespace) -> int:
    gc_tuning.tune_for_serving()  # as the control plane runs
    reference_before = reference_loop_ms()
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(32000) for _ in range(args.prompt_tokens)] for _ in range(NUM_HOT_PROMPTS)]
    rows = []
    sizes = [int(s) for s in args.workers.split(",") if s]
    fleets = [f for f in args.fleets.split(",") if f]
    if unknown := set(fleets) - set(FLEETS):
        print(f"kvplane bench routing: unknown fleets {sorted(unknown)}; choose from {list(FLEETS)}", file=sys.stderr)
        return 2
    admissions = [a for a in args.admissions.split(",") if a]
    if args.passes < 1:
        print(f"kvplane bench routing: --passes must be at least 1, got {args.passes}", file=sys.stderr)
        return 2
    for size in sizes:
        for fleet in fleets:
            print(f"building {fleet} fleet: {size} workers x {args.blocks_per_worker} blocks ...", file=sys.stderr, flush=True)
            if not args.no_memory:
                tracemalloc.start()
            workers, index = build_fleet(size, args.blocks_per_worker, fleet, prompts, random.Random(args.seed + size))
            bytes_per_block = None
            if not args.no_memory:
                bytes_per_block = tracemalloc.get_traced_memory()[0] / (size * args.blocks_per_worker)
                tracemalloc.stop()
            for admission in admissions:
                result = {"all priced": (None, None)}
                default = RouterConfig().max_uncached_candidates
                runs = [("all priced", 0)] * (not args.no_baseline) + [("default", default)]
                for label, max_uncached in runs:
                    print(
                        f"  {admission}, {label}: {num_warm_up(args)} warm-up + {args.requests} requests"
                        f"{f' x {args.passes} passes' if args.passes > 1 else ''} ...",
                        file=sys.stderr,
                        flush=True,
                    )
                    seconds = least_of_passes(workers, index, fleet_prompts(fleet, prompts), admission, max_uncached, args)
                    result[label] = (percentile(seconds, 50) * 1e3, percentile(seconds, 99) * 1e3)
                (all_p50, all_p99), (p50, p99) = result["all priced"], result["default"]
                rows.append({
                    "workers": size, "indexed_blocks": size * args.blocks_per_worker, "bytes_per_block": bytes_per_block,
                    "fleet": fleet, "admission": admission,
                    "all_priced_p50_ms": all_p50, "all_priced_p99_ms": all_p99, "p50_ms": p50, "p99_ms": p99,
                    "p99_speedup": None if all_p99 is None else all_p99 / p99,
                })  # fmt: skip
    reference = (reference_before, reference_loop_ms())
    if args.json:
        print(json.dumps({"prompt_tokens": args.prompt_tokens, "passes": args.passes, "reference_loop_ms": reference, "rows": rows}))
        return 0
    print(f"view update + Planner.plan (route + admit) of a {args.prompt_tokens}-token prompt, ms per request")
    print(
        f"{'workers':>7} {'blocks':>9} {'B/block':>7} {'fleet':<10} {'admission':<10} {'all p50':>8} {'all p99':>8} {'p50':>7} {'p99':>7} {'p99 x':>6}"
    )
    for r in rows:
        print(f"{r['workers']:>7} {r['indexed_blocks']:>9} {_cell(r['bytes_per_block'], 7, 0)} {r['fleet']:<10} {r['admission']:<10} "
              f"{_cell(r['all_priced_p50_ms'], 8, 2)} {_cell(r['all_priced_p99_ms'], 8, 2)} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
              f"{_cell(r['p99_speedup'], 6, 1)}")  # fmt: skip
    print("all = every worker priced (the baseline); p50/p99 = the default (of each number of matched blocks, the 16 least loaded)")
    if args.passes > 1:
        print(f"each request's least time over {args.passes} passes of the same requests")
    print(f"machine speed: a 1,000,000-step Python loop took {reference[0]:.0f} ms before the rows and {reference[1]:.0f} ms after")
    return 0


def _cell(value: float | None, width: int, digits: int) -> str:
    """A number right-aligned in `width`, or "-" where it was not measured (--no-baseline)."""
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"
