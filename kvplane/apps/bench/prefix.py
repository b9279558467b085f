"""`kvplane bench prefix`: prefix-cache hit rate, TTFT and load spread per routing policy.

For each workload x policy, a fresh local cluster (control plane with `--routing-policy POLICY
--admission none`, 4 `both` agents of the builtin model with a bounded device pool and a host
tier) replays the workload open loop: each request is sent at its arrival time (a chat turn or
agent step also waits for the previous one to finish), with `ignore_eos`, so every policy does
the same work. Reported per run:

- hit_rate: prompt tokens not computed (cached on the decode worker, incl. host-tier loads and
  fetched blocks) / prompt tokens;
- oracle_hit_rate: the same for one pooled LRU prefix cache holding every worker's capacity
  (4 x max(device, host) blocks), fed in arrival order: what a router knowing every cache, with
  no load limits, could reach (the engine's rule applies: the last prompt token is computed);
- prefill_tokens: prompt tokens computed; ttft_ms p50/p99 as the control plane measured them;
- throughput_tok_s: (prompt + generated tokens) / wall time from the first send to the last reply;
- max_load_over_mean: per worker, computed prefill tokens + generated tokens; the max over the mean.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from kvplane.apps.bench import workloads as wl
from kvplane.apps.cli import engine_flags
from kvplane.stats import percentile

POLICIES = ("round-robin", "least-load", "prefix-only", "kvplane")
NUM_AGENTS = 4
BLOCK_SIZE = 16
MODEL = "builtin-tiny"
JSON_KEYS = ("workload", "policy", "hit_rate", "oracle_hit_rate", "prefill_tokens", "ttft_p50_ms", "ttft_p99_ms",
             "throughput_tok_s", "max_load_over_mean")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="all", help=f"comma-separated of {', '.join(wl.WORKLOADS)}, or all (default %(default)s)")
    parser.add_argument("--policy", default="all", help=f"comma-separated of {', '.join(POLICIES)}, or all (default %(default)s)")
    parser.add_argument(
        "--trace",
        default="",
        metavar="FILE",
        help="Mooncake-format trace (.jsonl or .jsonl.gz) for --workload trace (default: the bundled Mooncake conversation trace)",
    )
    parser.add_argument("--trace-requests", type=int, default=300, help="first N trace requests (default %(default)s)")
    parser.add_argument(
        "--trace-token-scale", type=int, default=32, help="trace lengths and its 512-token block divided by this (default %(default)s)"
    )
    parser.add_argument("--trace-time-scale", type=float, default=4.0, help="trace time divided by this (default %(default)s)")
    parser.add_argument("--num-blocks", type=int, default=384, help="device KV blocks per agent (default %(default)s)")
    parser.add_argument("--host-blocks", type=int, default=1536, help="host-tier KV blocks per agent (default %(default)s)")
    parser.add_argument(
        "--controlplane-args", default="", help="extra control-plane flags for every run, e.g. '--guard-ratio 2' (experiments)"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default %(default)s)")
    parser.add_argument("--agents", type=int, default=NUM_AGENTS, help="`both` agents per run (default %(default)s)")
    parser.add_argument("--json", action="store_true", help='print {"rows": [{' + ", ".join(f'"{k}"' for k in JSON_KEYS) + "}]}")
    parser.add_argument("--plot", default="", help="write a PNG of hit rates and TTFT p99 here (needs matplotlib)")
    parser.set_defaults(engine_flags=engine_flags.add_arguments(parser))


def make_workload(name: str, args: argparse.Namespace) -> list[wl.BenchRequest]:
    if name == "trace":
        return wl.trace(args.trace, args.trace_requests, args.trace_token_scale, args.trace_time_scale, seed=args.seed)
    return getattr(wl, name)(args.seed)


def oracle_hit_rate(requests: list[wl.BenchRequest], capacity_blocks: int) -> float:
    from kvplane.apps.sim.simulator import OracleCache
    from kvplane.block_hash import hash_blocks

    oracle = OracleCache(capacity_blocks, BLOCK_SIZE)
    hit = total = 0
    for r in sorted(requests, key=lambda r: r.arrival_s):
        hit += oracle.feed(hash_blocks(r.prompt, BLOCK_SIZE, MODEL), len(r.prompt))
        total += len(r.prompt)
    return hit / total if total else 0.0


def run_policy(workload: str, requests: list[wl.BenchRequest], policy: str, args: argparse.Namespace, log) -> dict:
    from kvplane.apps.cluster import ClusterError

    for attempt in range(3):
        try:
            return _run_policy(workload, requests, policy, args, log)
        except ClusterError as e:  # e.g. a port taken by another process between pick and bind
            if attempt == 2:
                raise
            log(f"[{workload} / {policy}] the cluster did not start ({str(e).splitlines()[0]}); retrying")
    raise AssertionError("unreachable")


def _run_policy(workload: str, requests: list[wl.BenchRequest], policy: str, args: argparse.Namespace, log) -> dict:
    from kvplane import Client
    from kvplane.apps.cluster import LocalCluster

    agent_args = ["--model", MODEL, "--block-size", str(BLOCK_SIZE), "--num-blocks", str(args.num_blocks),
                  "--host-blocks", str(args.host_blocks), "--transports", "grpc", *engine_flags.forward_args(args, args.engine_flags)]  # fmt: skip
    if _sim(args) and getattr(args, "sim_num_blocks", None) is None:
        agent_args += ["--sim-num-blocks", str(args.num_blocks)]  # the same device pool as the reference runs
    cp_args = ("--routing-policy", policy, "--admission", "none", *args.controlplane_args.split())
    log(f"[{workload} / {policy}] starting {args.agents} agents ...")
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    done = [threading.Event() for _ in requests]
    results: list = [None] * len(requests)
    with LocalCluster(num_prefill=0, num_decode=0, num_both=args.agents, agent_args=agent_args, controlplane_args=cp_args) as cluster:
        with Client(cluster.endpoint, timeout=600) as client:
            start = time.monotonic() + 0.5

            def send(i: int) -> None:
                r = requests[i]
                try:
                    if r.after >= 0:
                        done[r.after].wait()
                    time.sleep(max(0.0, start + r.arrival_s - time.monotonic()))
                    result = client.generate(list(r.prompt), max_tokens=r.max_tokens, ignore_eos=True, disagg="auto")
                    results[i] = (result, time.monotonic())
                except Exception as e:  # counted, not fatal: the row says how many failed
                    results[i] = e
                finally:
                    done[i].set()

            with ThreadPoolExecutor(max_workers=len(requests)) as pool:
                list(pool.map(send, order))
    failures = [r for r in results if isinstance(r, Exception)]
    ok = [r for r in results if not isinstance(r, Exception)]
    if failures:
        log(f"[{workload} / {policy}] {len(failures)} requests failed, e.g. {failures[0]}")
    prompt = sum(r.metrics.prompt_tokens for r, _ in ok)
    cached = sum(r.metrics.cached_tokens for r, _ in ok)
    generated = sum(len(r.token_ids) for r, _ in ok)
    load = {f"both-{i}": 0 for i in range(args.agents)}
    for r, _ in ok:
        load[r.metrics.decode_worker] = load.get(r.metrics.decode_worker, 0) + r.metrics.prefill_computed_tokens + len(r.token_ids)
    mean = sum(load.values()) / len(load)
    wall = max((t for _, t in ok), default=start) - start
    ttfts = [r.metrics.ttft_ms for r, _ in ok]
    row = {
        "workload": workload,
        "policy": policy,
        "hit_rate": cached / prompt if prompt else 0.0,
        "oracle_hit_rate": oracle_hit_rate(
            requests, args.agents * (args.num_blocks if _sim(args) else max(args.num_blocks, args.host_blocks))
        ),
        "prefill_tokens": prompt - cached,
        "ttft_p50_ms": percentile(ttfts, 50) or 0.0,
        "ttft_p99_ms": percentile(ttfts, 99) or 0.0,
        "throughput_tok_s": (prompt + generated) / wall if wall > 0 else 0.0,
        "max_load_over_mean": max(load.values()) / mean if mean else 0.0,
        "requests": len(requests),
        "failed": len(failures),
        "fetches": sum(1 for r, _ in ok if r.metrics.kv_fetched_from),
    }
    log(f"[{workload} / {policy}] hit {row['hit_rate']:.3f} (oracle {row['oracle_hit_rate']:.3f}), "
        f"TTFT p50 {row['ttft_p50_ms']:.0f} ms p99 {row['ttft_p99_ms']:.0f} ms, load max/mean {row['max_load_over_mean']:.2f}")  # fmt: skip
    return row


def _sim(args: argparse.Namespace) -> bool:
    """Sim agents: no host tier, the device pool set by --sim-num-blocks (default: --num-blocks)."""
    return getattr(args, "engine", "") == "sim"


def to_json(rows: list[dict]) -> str:
    """The --json document: {"rows": [...]} with exactly the JSON_KEYS of each row."""
    return json.dumps({"rows": [{k: r[k] for k in JSON_KEYS} for r in rows]})


def _names(value: str, known: tuple[str, ...], what: str) -> list[str]:
    names = list(known) if value == "all" else [n for n in value.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(f"kvplane bench prefix: unknown {what} {unknown or value!r}; choose from {', '.join(known)} or all")
    return names


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    width = 0.8 / len(policies)
    for p_i, policy in enumerate(policies):
        xs = [w_i + p_i * width for w_i in range(len(workloads))]
        get = {r["workload"]: r for r in rows if r["policy"] == policy}
        axes[0].bar(xs, [get[w]["hit_rate"] if w in get else 0 for w in workloads], width, label=policy)
        axes[1].bar(xs, [get[w]["ttft_p99_ms"] if w in get else 0 for w in workloads], width, label=policy)
        axes[2].bar(xs, [get[w]["max_load_over_mean"] if w in get else 0 for w in workloads], width, label=policy)
    oracle = {r["workload"]: r["oracle_hit_rate"] for r in rows}
    for w_i, w in enumerate(workloads):
        axes[0].hlines(oracle[w], w_i - width / 2, w_i + 0.8 - width / 2, colors="black", linestyles="dashed")
    for ax, title in zip(axes, ("prefix hit rate (dashed: oracle)", "TTFT p99 (ms, log)", "max load / mean load (red: 1.5)")):
        ax.set_xticks([w_i + 0.4 - width / 2 for w_i in range(len(workloads))], workloads)
        ax.set_title(title)
    axes[1].set_yscale("log")
    axes[2].axhline(1.5, color="red", linewidth=0.8)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    rows = []
    for workload in _names(args.workload, wl.WORKLOADS, "workload"):
        requests = make_workload(workload, args)
        for policy in _names(args.policy, POLICIES, "policy"):
            rows.append(run_policy(workload, requests, policy, args, log))
    if args.plot:
        plot(rows, args.plot)
        log(f"wrote {args.plot}")
    if args.json:
        print(to_json(rows))
        return 0
    print(f"{'workload':<8} {'policy':<12} {'hit':>6} {'oracle':>6} {'prefill tok':>11} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'tok/s':>8} {'max/mean':>8} {'fetches':>7} {'failed':>6}")  # fmt: skip
    for r in rows:
        print(f"{r['workload']:<8} {r['policy']:<12} {r['hit_rate']:>6.3f} {r['oracle_hit_rate']:>6.3f} {r['prefill_tokens']:>11} "
              f"{r['ttft_p50_ms']:>9.1f} {r['ttft_p99_ms']:>9.1f} {r['throughput_tok_s']:>8.0f} {r['max_load_over_mean']:>8.2f} "
              f"{r['fetches']:>7} {r['failed']:>6}")  # fmt: skip
    return 0
