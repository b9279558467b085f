"""`kvplane bench load`: goodput of the admission policies under open-loop load on a real local cluster.

Method (each step prints to stderr as it runs):
1. Start a LocalCluster (default: 1 prefill + 1 decode agent, builtin-tiny, remote prefill for
   prompts of 256+ uncached tokens so that long prompts cross between the agents) or use
   `--endpoint`. Optionally `profile` every worker (seeds the latency model).
2. Unloaded latency: a few requests of the mix one at a time (policy `none`); the objectives
   are `--objective-factor` x their p90 TTFT and TPOT (batch: 4x that), set with
   `set_config("objectives.<model>.<priority>.ttft_ms|tpot_ms", ...)`.
3. Capacity: a closed loop at saturation (policy `none`, `--capacity-concurrency` requests in
   flight) for `--capacity-s`; capacity = requests completed per second.
4. For each policy (`set_config("admission.policy", name)`) and load factor: an open-loop seeded
   Poisson process at load_factor x capacity for `--duration` seconds (or a trace replayed at
   its own timestamps / speed), each request streamed concurrently (asyncio) with a deadline.

Per cell, over the requests that arrived in it (`summarize`):
- admitted / rejected: rejected = the control plane answered RESOURCE_EXHAUSTED.
- TTFT = first token's arrival at the client - the request's send time; TPOT = (last token - first
  token) / (tokens - 1), undefined for one token. A request that failed or hit its deadline after
  admission counts as missing its objectives, with the time it waited as its TTFT (a lower bound).
- goodput_rps = requests that met both objectives of their priority / the cell's duration;
  attainment = met / admitted (None with nothing admitted).
- missed_ttft / missed_tpot: admitted requests that missed that objective (one may miss both; a
  failed one misses TTFT).
- ttft_prediction_error = mean |predicted - measured| / measured over admitted requests whose
  metrics carry a prediction (RequestMetrics.predicted_ttft_ms > 0); None without predictions.
  tpot_prediction_error: the same for TPOT (RequestMetrics.predicted_tpot_ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvplane.apps.bench.workload import (
    PRIORITY_BATCH,
    PRIORITY_INTERACTIVE,
    MixConfig,
    RequestSpec,
    TraceScale,
    poisson_arrivals,
    read_trace,
    synthetic_requests,
    trace_requests,
)
from kvplane.apps.cli import engine_flags
from kvplane.stats import percentile
from kvplane.types import Objective

DEFAULT_RATES = "0.5,1,1.5,2,3"
DEFAULT_POLICIES = "none,threshold,predictive"
BATCH_OBJECTIVE_FACTOR = 4.0
ROW_KEYS = (
    "policy", "load_factor", "offered_rps", "admitted", "rejected", "goodput_rps", "attainment",
    "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "missed_ttft", "missed_tpot", "ttft_prediction_error",
    "tpot_prediction_error",
)  # fmt: skip

# ---------------------------------------------------------------------------------------------
# Metric math: pure functions.


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request met, as the client measured it."""

    priority: str
    admitted: bool
    ttft_s: float | None = None  # None when rejected
    tpot_s: float | None = None  # None with fewer than 2 tokens
    num_tokens: int = 0
    predicted_ttft_ms: float = 0.0  # 0 = no prediction
    predicted_tpot_ms: float = 0.0
    failed: bool = False  # admitted, then an error or the deadline


def tpot_seconds(first_token_s: float, last_token_s: float, num_tokens: int) -> float | None:
    """Time per output token after the first; None for fewer than two tokens."""
    if num_tokens < 2:
        return None
    return (last_token_s - first_token_s) / (num_tokens - 1)


def missed_ttft(outcome: Outcome, objective: Objective) -> bool:
    return outcome.failed or outcome.ttft_s is None or outcome.ttft_s * 1000 > objective.ttft_ms


def missed_tpot(outcome: Outcome, objective: Objective) -> bool:
    return outcome.tpot_s is not None and outcome.tpot_s * 1000 > objective.tpot_ms


def meets_objective(outcome: Outcome, objective: Objective) -> bool:
    return outcome.admitted and not missed_ttft(outcome, objective) and not missed_tpot(outcome, objective)


def prediction_error(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Mean |predicted - measured| / measured over (predicted, measured) pairs with both > 0."""
    usable = [(p, m) for p, m in pairs if p > 0 and m > 0]
    if not usable:
        return None
    return sum(abs(p - m) / m for p, m in usable) / len(usable)


def summarize(outcomes: Sequence[Outcome], duration_s: float, objectives: dict[str, Objective]) -> dict[str, Any]:
    """The row fields a cell reports besides its policy and load factor (see the module docstring)."""
    admitted = [o for o in outcomes if o.admitted]
    met = sum(meets_objective(o, objectives[o.priority]) for o in admitted)
    ttfts = [o.ttft_s * 1000 for o in admitted if o.ttft_s is not None]
    tpots = [o.tpot_s * 1000 for o in admitted if o.tpot_s is not None and not o.failed]

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    completed = [o for o in admitted if not o.failed]
    ttft_error = prediction_error([(o.predicted_ttft_ms, o.ttft_s * 1000) for o in completed if o.ttft_s])
    tpot_error = prediction_error([(o.predicted_tpot_ms, o.tpot_s * 1000) for o in completed if o.tpot_s])
    return {
        "offered_rps": round(len(outcomes) / duration_s, 4) if duration_s > 0 else 0.0,
        "admitted": len(admitted),
        "rejected": len(outcomes) - len(admitted),
        "goodput_rps": round(met / duration_s, 4) if duration_s > 0 else 0.0,
        "attainment": round(met / len(admitted), 4) if admitted else None,
        "ttft_p50_ms": ms(percentile(ttfts, 50)),
        "ttft_p99_ms": ms(percentile(ttfts, 99)),
        "tpot_p50_ms": ms(percentile(tpots, 50)),
        "tpot_p99_ms": ms(percentile(tpots, 99)),
        "missed_ttft": sum(missed_ttft(o, objectives[o.priority]) for o in admitted),
        "missed_tpot": sum(missed_tpot(o, objectives[o.priority]) for o in admitted),
        "ttft_prediction_error": None if ttft_error is None else round(ttft_error, 4),
        "tpot_prediction_error": None if tpot_error is None else round(tpot_error, 4),
    }


def objective_from_unloaded(ttfts_ms: Sequence[float], tpots_ms: Sequence[float], factor: float) -> Objective:
    """`factor` x the unloaded p90, rounded up to a whole millisecond."""
    ttft = percentile(ttfts_ms, 90)
    tpot = percentile(tpots_ms, 90)
    if ttft is None or tpot is None:
        raise ValueError("no unloaded TTFT/TPOT samples to set objectives from")
    return Objective(float(math.ceil(ttft * factor)), float(math.ceil(tpot * factor)))


def parse_floats(text: str, name: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} must be comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"{name} must be one or more numbers > 0, got {text!r}")
    return values


# ---------------------------------------------------------------------------------------------
# Driving the cluster.


async def run_request(client: Any, spec: RequestSpec) -> Outcome:
    """Streams one request and times its tokens on arrival."""
    from kvplane.errors import KvplaneError, RejectedError

    loop = asyncio.get_running_loop()
    sent = loop.time()
    first = last = None
    num_tokens = 0
    predicted = predicted_tpot = 0.0
    try:
        async for chunk in client.stream(spec.prompt, max_tokens=spec.max_tokens, ignore_eos=True, priority=spec.priority):
            if chunk.token_ids:
                now = loop.time()
                first = now if first is None else first
                last = now
                num_tokens += len(chunk.token_ids)
            if chunk.metrics is not None:
                predicted, predicted_tpot = chunk.metrics.predicted_ttft_ms, chunk.metrics.predicted_tpot_ms
    except RejectedError:
        return Outcome(spec.priority, admitted=False)
    except KvplaneError:
        waited = (first if first is not None else loop.time()) - sent
        return Outcome(spec.priority, admitted=True, ttft_s=waited, num_tokens=num_tokens, failed=True)
    if first is None:  # finished without tokens (max_tokens 0): nothing to time
        return Outcome(spec.priority, admitted=True, ttft_s=loop.time() - sent, predicted_ttft_ms=predicted)
    return Outcome(
        spec.priority, admitted=True, ttft_s=first - sent, tpot_s=tpot_seconds(first, last, num_tokens),
        num_tokens=num_tokens, predicted_ttft_ms=predicted, predicted_tpot_ms=predicted_tpot,
    )  # fmt: skip


async def run_open_loop(client: Any, specs: Sequence[RequestSpec], label: str, log: Callable[[str], None]) -> list[Outcome]:
    """Sends each request at its arrival time, whatever the cluster does; waits for all to end."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks: list[asyncio.Task[Outcome]] = []
    next_report = start + 5.0
    for spec in specs:
        delay = start + spec.arrival_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(run_request(client, spec)))
        if loop.time() >= next_report:
            done = [t.result() for t in tasks if t.done()]
            rejected = sum(not o.admitted for o in done)
            log(f"  [{label}] {loop.time() - start:5.1f} s: sent {len(tasks)}/{len(specs)}, "
                f"finished {len(done) - rejected}, rejected {rejected}, in flight {len(tasks) - len(done)}")  # fmt: skip
            next_report += 5.0
    return list(await asyncio.gather(*tasks))


async def run_closed_loop(client: Any, specs: Sequence[RequestSpec], concurrency: int, seconds: float) -> float:
    """Requests completed per second with `concurrency` always in flight (the first second is warm-up)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    warm, end = start + min(1.0, seconds / 4), start + seconds
    completed = 0
    position = 0

    async def worker() -> None:
        nonlocal completed, position
        while loop.time() < end:
            spec = specs[position % len(specs)]
            position += 1
            outcome = await run_request(client, spec)
            if outcome.admitted and not outcome.failed and loop.time() >= warm and loop.time() <= end:
                completed += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return completed / (end - warm)


async def wait_idle(client: Any, timeout_s: float = 30.0) -> None:
    """Until every worker reports nothing running or waiting (the previous cell has drained)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = await client.workers()
        if all(w.load.num_running == 0 and w.load.num_waiting == 0 for w in workers):
            return
        await asyncio.sleep(0.3)


@dataclass(frozen=True, slots=True)
class Cell:
    policy: str
    label: str  # "x1.5" or "speed 2"
    specs: list[RequestSpec]
    duration_s: float
    load_factor: float | None  # the asked multiple of capacity; None for a trace (then: offered / capacity)


async def measure(args: argparse.Namespace, endpoint: str, log: Callable[[str], None]) -> dict[str, Any]:
    from kvplane.client import AsyncClient

    mix = MixConfig(batch_fraction=args.batch_fraction).scaled(args.mix_scale).validate()
    async with AsyncClient(endpoint, timeout=args.request_timeout) as client:
        workers = await client.workers()
        model = workers[0].model
        max_context = min(w.max_context for w in workers if w.max_context) or 2048
        names = ", ".join(f"{w.worker_id} ({w.role.value if w.role else '?'})" for w in workers)
        log(f"cluster at {endpoint}: {names}; model {model}")
        if args.profile:
            for w in workers:
                try:
                    p = await client.profile(w.worker_id)
                    log(f"profiled {w.worker_id}: {p.num_samples} samples, fit error {p.mean_abs_pct_error * 100:.1f}%")
                except Exception as e:  # noqa: BLE001 - a cluster without profiling still benchmarks
                    log(f"could not profile {w.worker_id}: {e}")

        await client.set_config("admission.policy", "none")
        rng = random.Random(args.seed)
        sample = synthetic_requests([0.0] * 64, mix, rng)
        for spec in sample[:4]:  # warm-up: first-call costs and the system prompts' cache entries
            await run_request(client, spec)
        unloaded = [await run_request(client, spec) for spec in sample[4:16]]
        ttfts = [o.ttft_s * 1000 for o in unloaded if o.ttft_s is not None and not o.failed]
        tpots = [o.tpot_s * 1000 for o in unloaded if o.tpot_s is not None]
        interactive = (
            Objective(args.ttft_ms, args.tpot_ms) if args.ttft_ms and args.tpot_ms
            else objective_from_unloaded(ttfts, tpots, args.objective_factor)
        )  # fmt: skip
        objectives = {
            PRIORITY_INTERACTIVE: interactive,
            PRIORITY_BATCH: Objective(interactive.ttft_ms * BATCH_OBJECTIVE_FACTOR, interactive.tpot_ms * BATCH_OBJECTIVE_FACTOR),
        }
        for priority, objective in objectives.items():
            await client.set_config(f"objectives.{model}.{priority}.ttft_ms", f"{objective.ttft_ms:g}")
            await client.set_config(f"objectives.{model}.{priority}.tpot_ms", f"{objective.tpot_ms:g}")
        log(f"unloaded p50 TTFT {percentile(ttfts, 50):.1f} ms, TPOT {percentile(tpots, 50):.2f} ms; objectives: "
            f"interactive TTFT {interactive.ttft_ms:g} ms / TPOT {interactive.tpot_ms:g} ms, batch x{BATCH_OBJECTIVE_FACTOR:g}")  # fmt: skip

        log(f"capacity: closed loop, {args.capacity_concurrency} in flight for {args.capacity_s:g} s ...")
        # Fresh requests (never a repeated prompt), so the prefix cache helps as much as in the cells.
        fresh = synthetic_requests([0.0] * 2000, mix, random.Random(f"{args.seed}:capacity"))
        capacity = await run_closed_loop(client, fresh, args.capacity_concurrency, args.capacity_s)
        log(f"capacity {capacity:.2f} requests/s")
        await asyncio.sleep(0.5)  # load reports lag by up to 0.2 s
        await wait_idle(client)

        cells = build_cells(args, mix, capacity, max_context, log)
        rows = []
        for policy in args.policies:
            await client.set_config("admission.policy", policy)
            await asyncio.sleep(1.0)  # every replica applies a change within a second
            for cell in (c for c in cells if c.policy == policy):
                log(f"[{policy} {cell.label}] {len(cell.specs)} requests over {cell.duration_s:g} s")
                outcomes = await run_open_loop(client, cell.specs, f"{policy} {cell.label}", log)
                factor = cell.load_factor if cell.load_factor is not None else len(cell.specs) / cell.duration_s / capacity
                row = {"policy": policy, "load_factor": round(factor, 3)}
                row.update(summarize(outcomes, cell.duration_s, objectives))
                rows.append({k: row[k] for k in ROW_KEYS})
                log(f"[{policy} {cell.label}] " + ", ".join(f"{k}={row[k]}" for k in ROW_KEYS[2:]))
                await asyncio.sleep(0.5)
                await wait_idle(client)
        await client.set_config("admission.policy", "")
    return {"capacity_rps": round(capacity, 4), "rows": rows, "objectives": objectives}


def build_cells(args: argparse.Namespace, mix: MixConfig, capacity: float, max_context: int, log: Callable[[str], None]) -> list[Cell]:
    """The same seeded requests per load level for every policy, so policies see identical load."""
    levels: list[tuple[str, list[RequestSpec], float, float | None]] = []
    if args.trace:
        records = read_trace(args.trace)
        for speed in args.speeds:
            scale = TraceScale(length_scale=args.length_scale, speed=speed)
            specs, clipped = trace_requests(records, scale, max_context=max_context, duration_s=args.duration,
                                            vocab_size=mix.vocab_size)  # fmt: skip
            duration = args.duration or (specs[-1].arrival_s if specs else 1.0)
            log(f"trace {args.trace}: lengths and block size / {args.length_scale:g} ({scale.block_tokens}-token blocks), "
                f"time / {speed:g}; {len(specs)} requests in {duration:g} s, {clipped} clipped to {max_context} tokens")  # fmt: skip
            levels.append((f"speed {speed:g}", specs, duration, None))
    else:
        for factor in args.rates:
            rng = random.Random(f"{args.seed}:{factor}")
            arrivals = poisson_arrivals(factor * capacity, args.duration, rng)
            levels.append((f"x{factor:g}", synthetic_requests(arrivals, mix, rng), args.duration, factor))
    return [Cell(policy, *level) for policy in args.policies for level in levels]


def in_simulated_time(
    result: dict[str, Any], objectives: dict[str, Objective], speedup: float
) -> tuple[dict[str, Any], dict[str, Objective]]:
    """Rows measured in wall time against sim agents running at `speedup` simulated seconds per
    wall second, turned into simulated time: durations x speedup, rates / speedup."""
    rows = []
    for r in result["rows"]:
        r = dict(r)
        for key in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"):
            r[key] = None if r[key] is None else round(r[key] * speedup, 3)
        for key in ("offered_rps", "goodput_rps"):
            r[key] = round(r[key] / speedup, 4)
        rows.append(r)
    scaled = {p: Objective(o.ttft_ms * speedup, o.tpot_ms * speedup) for p, o in objectives.items()}
    return {**result, "capacity_rps": round(result["capacity_rps"] / speedup, 4), "rows": rows}, scaled


# ---------------------------------------------------------------------------------------------
# Output.


def format_rows(result: dict[str, Any]) -> str:
    def cell(value: Any, digits: int = 1) -> str:
        if value is None:
            return "-"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    def percent(value: float | None, digits: int = 0) -> str:
        return "-" if value is None else f"{value * 100:.{digits}f}%"

    headers = ("policy", "load", "offered/s", "admitted", "rejected", "goodput/s", "attain", "TTFT p50", "TTFT p99",
               "TPOT p50", "TPOT p99", "missed TTFT", "missed TPOT", "TTFT pred err", "TPOT pred err")  # fmt: skip
    lines = [" | ".join(headers), " | ".join("---" for _ in headers)]
    for r in result["rows"]:
        lines.append(" | ".join((
            r["policy"], f"{r['load_factor']:.2f}", f"{r['offered_rps']:.2f}", str(r["admitted"]), str(r["rejected"]),
            f"{r['goodput_rps']:.2f}", percent(r["attainment"], 1), cell(r["ttft_p50_ms"]), cell(r["ttft_p99_ms"]),
            cell(r["tpot_p50_ms"], 2), cell(r["tpot_p99_ms"], 2), cell(r.get("missed_ttft")), cell(r.get("missed_tpot")),
            percent(r["ttft_prediction_error"]), percent(r.get("tpot_prediction_error")),
        )))  # fmt: skip
    return "\n".join(f"| {line} |" for line in lines)


def write_plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (goodput_ax, attain_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy in dict.fromkeys(r["policy"] for r in result["rows"]):
        rows = sorted((r for r in result["rows"] if r["policy"] == policy), key=lambda r: r["offered_rps"])
        x = [r["offered_rps"] for r in rows]
        goodput_ax.plot(x, [r["goodput_rps"] for r in rows], marker="o", label=policy)
        attain_ax.plot(x, [100 * (r["attainment"] or 0.0) for r in rows], marker="o", label=policy)
    capacity = result["capacity_rps"]
    for ax in (goodput_ax, attain_ax):
        ax.axvline(capacity, color="grey", linestyle=":", linewidth=1, label="capacity")
        ax.set_xlabel("offered load (requests/s)")
        ax.grid(alpha=0.3)
        ax.legend()
    goodput_ax.set_ylabel("goodput (requests/s meeting both objectives)")
    attain_ax.set_ylabel("objective attainment of admitted requests (%)")
    attain_ax.set_ylim(0, 105)
    fig.suptitle("kvplane bench load: admission policies under open-loop load")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Command.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rates",
        type=lambda t: parse_floats(t, "--rates"),
        default=parse_floats(DEFAULT_RATES, "--rates"),
        metavar="F,F,...",
        help=f"load factors: multiples of the measured capacity (default {DEFAULT_RATES})",
    )
    parser.add_argument(
        "--policy",
        dest="policies",
        type=lambda t: [p for p in t.split(",") if p],
        default=DEFAULT_POLICIES.split(","),
        metavar="P,P,...",
        help=f"admission policies to compare (default {DEFAULT_POLICIES})",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=15.0,
        metavar="S",
        help="seconds of arrivals per cell (default %(default)s; with --trace: the replayed window)",
    )
    parser.add_argument(
        "--trace",
        default="",
        metavar="FILE",
        help="replay a Mooncake-format JSONL trace (.jsonl or .jsonl.gz; the bundled one: kvplane/apps/bench/data/) instead of Poisson arrivals",
    )
    parser.add_argument(
        "--speed",
        dest="speeds",
        type=lambda t: parse_floats(t, "--speed"),
        default=[1.0],
        metavar="F,F,...",
        help="trace time divided by F, one cell per value (default 1)",
    )
    parser.add_argument(
        "--length-scale",
        type=float,
        default=32.0,
        metavar="F",
        help="trace lengths and its 512-token block size divided by F (default %(default)s: 16-token blocks)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of arrivals and the request mix (default %(default)s)")
    parser.add_argument(
        "--batch-fraction", type=float, default=0.0, metavar="F", help="share of requests sent as priority batch (default 0)"
    )
    parser.add_argument(
        "--objective-factor",
        type=float,
        default=3.0,
        metavar="F",
        help="interactive objectives = F x the unloaded p90 TTFT and TPOT (default %(default)s)",
    )
    parser.add_argument("--ttft-ms", type=float, default=0.0, metavar="MS", help="fixed interactive TTFT objective (with --tpot-ms)")
    parser.add_argument("--tpot-ms", type=float, default=0.0, metavar="MS", help="fixed interactive TPOT objective (with --ttft-ms)")
    parser.add_argument("--capacity-s", type=float, default=12.0, metavar="S", help="closed-loop capacity run length (default %(default)s)")
    parser.add_argument(
        "--capacity-concurrency",
        type=int,
        default=16,
        metavar="N",
        help="requests in flight while measuring capacity (default %(default)s)",
    )
    parser.add_argument("--request-timeout", type=float, default=10.0, metavar="S", help="deadline per request (default %(default)s)")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="do not `kvplane profile` the workers first")
    parser.add_argument("--endpoint", default="", help="use a running control plane instead of starting a local cluster")
    parser.add_argument("--prefill", type=int, default=1, metavar="N", help="local cluster: prefill agents (default %(default)s)")
    parser.add_argument("--decode", type=int, default=1, metavar="N", help="local cluster: decode agents (default %(default)s)")
    parser.add_argument("--both", type=int, default=0, metavar="N", help="local cluster: prefill+decode agents (default %(default)s)")
    parser.add_argument(
        "--disagg-threshold",
        type=int,
        default=256,
        metavar="TOKENS",
        help="local cluster: uncached prompt tokens from which prefill runs remotely (default %(default)s)",
    )
    parser.add_argument("--mix-scale", type=float, default=1.0, metavar="F",
                        help="multiply every token count of the synthetic mix by F (default 1: sized for builtin-tiny; e.g. 8 for a 70B sim)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help='print {"capacity_rps": ..., "rows": [...]} only')
    parser.add_argument("--plot", default="", metavar="FILE.png", help="write goodput and attainment against offered load")
    parser.set_defaults(engine_flags=engine_flags.add_arguments(parser))


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.monotonic()
    if args.endpoint:
        result = asyncio.run(measure(args, args.endpoint, log))
    else:
        from kvplane.apps.cluster import LocalCluster

        agent_args = engine_flags.forward_args(args, args.engine_flags)
        engine = getattr(args, "engine", "the default engine")
        log(f"starting a local cluster: {args.prefill} prefill, {args.decode} decode, {args.both} both ({engine}) ...")
        cluster = LocalCluster(
            num_prefill=args.prefill, num_decode=args.decode, num_both=args.both, agent_args=agent_args,
            controlplane_args=("--disagg-threshold", str(args.disagg_threshold)), startup_timeout=300.0,
        )  # fmt: skip
        with cluster:
            result = asyncio.run(measure(args, cluster.endpoint, log))
    objectives = result.pop("objectives")
    speedup = getattr(args, "speedup", 1.0) if getattr(args, "engine", "") == "sim" else 1.0
    if speedup != 1.0:  # sim agents ran simulated time at `speedup` x wall time: report simulated time
        result, objectives = in_simulated_time(result, objectives, speedup)
        log(f"times and rates below are simulated (the agents ran {speedup:g} simulated seconds per wall second)")
    log(f"done in {time.monotonic() - started:.0f} s")
    if args.plot:
        write_plot(result, args.plot)
        log(f"plot written to {args.plot}")
    if args.json:
        print(json.dumps(result))
        return 0
    o = objectives[PRIORITY_INTERACTIVE]
    print(f"capacity {result['capacity_rps']:.2f} requests/s; objectives (interactive): TTFT {o.ttft_ms:g} ms, "
          f"TPOT {o.tpot_ms:g} ms; batch x{BATCH_OBJECTIVE_FACTOR:g}")  # fmt: skip
    print(format_rows(result))
    return 0
