"""`kvplane bench calibrate`: does the simulator, calibrated from a reference engine's profile,
predict that engine's unloaded TTFT?

1. A local cluster with one `both` agent of the reference engine (builtin-tiny by default) is
   profiled (`kvplane profile`: its fitted step-time model), and the model is written as
   `kvplane profile --json` would (`--profile-out`).
2. Unloaded TTFT, measured: for each prompt length, `--repeats` fresh prompts one at a time; the
   control plane's TTFT (RequestMetrics.ttft_ms, its receipt of the request to the first token).
3. The same requests, one at a time, through `kvplane sim` with that profile as the step time
   (`--sim-profile`), the same block size, chunk and batch limits.
Reported per length: measured and predicted TTFT medians and (predicted - measured) / measured.
What the profile cannot see (the control plane's validation and routing, two gRPC hops) is in
the simulation only as `--hop-ms` per hop.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvplane.apps.bench.load import parse_floats
from kvplane.apps.sim.fleet import AgentTiming
from kvplane.apps.sim.simulator import FleetSpec, SimRequest, Simulator
from kvplane.controlplane.core.planner import PlannerConfig
from kvplane.controlplane.core.settings import ClusterSettings
from kvplane.dataplane.engines.sim import SimConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", type=lambda t: parse_floats(t, "--lengths"), default=[64, 256, 512, 1024, 1536],
                        metavar="N,N", help="prompt lengths in tokens (default %(default)s)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=5, help="fresh prompts per length (default %(default)s)")
    parser.add_argument(
        "--hop-ms", type=float, default=AgentTiming().hop_s * 1000, help="simulated one-way RPC latency (default %(default)s)"
    )
    parser.add_argument("--profile-out", default="", metavar="FILE", help="keep the measured profile here (default: a temp file)")
    parser.add_argument("--seed", type=int, default=0, help="prompt seed (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def measure(args: argparse.Namespace, log) -> tuple[dict[str, Any], dict[int, list[float]], list[list[int]]]:
    from kvplane import Client
    from kvplane.apps.cluster import LocalCluster

    rng = random.Random(args.seed)
    prompts = [[rng.randrange(1, 256) for _ in range(int(n))] for n in args.lengths for _ in range(args.repeats)]
    measured: dict[int, list[float]] = {}
    log("starting one reference agent (builtin-tiny) and profiling it ...")
    with LocalCluster(num_prefill=0, num_decode=0, num_both=1, controlplane_args=("--admission", "none")) as cluster:
        with Client(cluster.endpoint, timeout=120) as client:
            p = client.profile("both-0")
            profile = {"worker_id": p.worker_id, "coefficients": list(p.coefficients), "num_samples": p.num_samples,
                       "mean_abs_pct_error": p.mean_abs_pct_error}  # fmt: skip
            log(f"profiled: {p.num_samples} steps, fit error {p.mean_abs_pct_error:.1%}")
            client.generate([1, 2, 3], max_tokens=2)  # warm-up
            for prompt in prompts:
                result = client.generate(prompt, max_tokens=2, disagg="never")
                measured.setdefault(len(prompt), []).append(result.metrics.ttft_ms)
    return profile, measured, prompts


def predict(args: argparse.Namespace, profile_path: str, prompts: list[list[int]]) -> dict[int, list[float]]:
    engine = SimConfig(model="llama-3-8b", tp=1, profile=profile_path, block_size=16, max_num_seqs=16, max_num_batched_tokens=2048)
    requests = [SimRequest(0.0, len(p), 2, (lambda p=p: p), after=i - 1) for i, p in enumerate(prompts)]
    sim = Simulator(
        FleetSpec(engine, num_both=1),
        PlannerConfig(admission_policy="none"),
        ClusterSettings(),
        agent=AgentTiming(hop_s=args.hop_ms / 1000),
    )
    predicted: dict[int, list[float]] = {}
    for r in sim.run(requests).records:
        predicted.setdefault(r.prompt_tokens, []).append(r.ttft_s * 1000)
    return predicted


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.monotonic()
    profile, measured, prompts = measure(args, log)
    path = args.profile_out or str(Path(tempfile.mkdtemp(prefix="kvplane-calibrate-")) / "profile.json")
    Path(path).write_text(json.dumps(profile))
    predicted = predict(args, path, prompts)
    rows = []
    for n in sorted(measured):
        m, p = statistics.median(measured[n]), statistics.median(predicted[n])
        rows.append({"prompt_tokens": n, "measured_ttft_ms": round(m, 2), "predicted_ttft_ms": round(p, 2), "error": round((p - m) / m, 4)})
    mean_abs = sum(abs(r["error"]) for r in rows) / len(rows)
    log(f"done in {time.monotonic() - started:.0f} s; profile at {path}")
    if args.json:
        print(json.dumps({"profile": profile, "rows": rows, "mean_abs_error": round(mean_abs, 4)}))
        return 0
    print(f"reference engine (builtin-tiny), profile of {profile['num_samples']} steps (fit error {profile['mean_abs_pct_error']:.1%}); "
          f"unloaded TTFT, median of {args.repeats}")  # fmt: skip
    print("| prompt tokens | measured ms | simulated ms | error |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['prompt_tokens']:,} | {r['measured_ttft_ms']:.1f} | {r['predicted_ttft_ms']:.1f} | {r['error']:+.1%} |")
    print(f"mean absolute error {mean_abs:.1%}")
    return 0
