"""`kvplane bench disagg`: colocated against disaggregated serving on the same GPUs, as the
prompt grows (the comparison DistServe, OSDI'24, made: up to 7.4x more requests within the
latency objectives for disaggregation).

For each prompt length, `kvplane plan`'s search (kvplane/apps/sim/plan.py, in simulation) finds the
most requests/s that `--workers` colocated workers serve with `--attainment` of requests meeting
both objectives, and the same for the best prefill:decode split of the same workers; the row
gives both, the split, and disaggregated / colocated. Colocated workers prefill every prompt
where it decodes (chunked prefill, sharing steps with the decodes); disaggregated ones prefill
every prompt on a prefill worker and move its KV over the link.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from kvplane.apps.bench.load import parse_floats
from kvplane.apps.sim import plan as plan_mod


def add_arguments(parser: argparse.ArgumentParser) -> None:
    plan_mod.add_arguments(parser)
    parser.add_argument("--lengths", type=lambda t: parse_floats(t, "--lengths"), default=[512, 1024, 2048, 4096, 8192],
                        metavar="N,N", help="prompt lengths in tokens, one row each (default 512 to 8192)")  # fmt: skip
    # Llama-3.1-70B: Llama-3-70B's shapes with a 128K context, so the longest prompts fit.
    parser.set_defaults(workers=4, duration=20.0, ttft_ms=1000.0, tpot_ms=40.0, sim_model="llama-3.1-70b")


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.monotonic()
    try:  # every length checked before the first (minutes-long) row
        planners = {}
        for length in (int(n) for n in args.lengths):
            args.input_tokens = str(length)
            planners[length] = plan_mod.Planner(args, log)
    except ValueError as e:
        print(f"kvplane bench disagg: {e}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    for length, planner in planners.items():
        log(f"[{length} tokens] colocated vs disaggregated on {args.workers} workers ...")
        colocated = planner.max_rate(plan_mod.Candidate(plan_mod.COLOCATED, 0, args.workers))
        disaggregated = planner.max_rate(planner.best_split(args.workers).candidate)
        row: dict[str, Any] = {"input_tokens": length, "output_tokens": args.output_tokens}
        for name, ev in (("colocated", colocated), ("disaggregated", disaggregated)):
            row[name] = planner.describe(ev) if ev is not None else None
        co = row["colocated"]["goodput_rps"] if row["colocated"] else 0.0
        dis = row["disaggregated"]["goodput_rps"] if row["disaggregated"] else 0.0
        row["disaggregated_over_colocated"] = round(dis / co, 3) if co else None
        rows.append(row)
        log(f"[{length} tokens] colocated {co:.2f} requests/s, disaggregated {dis:.2f} ({row['disaggregated_over_colocated']}x)")
    result = {
        "workers": args.workers,
        "hardware": {"model": planner.model.key, "gpu": planner.engine.gpu, "tp": planner.engine.tp, "link": planner.link.key},
        "objectives_ms": {"ttft": args.ttft_ms, "tpot": args.tpot_ms, "attainment": args.attainment},
        "rows": rows,
    }
    log(f"done in {time.monotonic() - started:.0f} s")
    if args.plot:
        write_plot(result, args.plot)
        log(f"plot written to {args.plot}")
    if args.json:
        print(json.dumps(result))
        return 0
    h, o = result["hardware"], result["objectives_ms"]
    print(f"{h['model']} on {h['tp']} x {h['gpu']} per worker, {args.workers} workers, KV over {h['link']}; "
          f"objectives TTFT {o['ttft']:g} ms, TPOT {o['tpot']:g} ms for {o['attainment']:.0%}; output {args.output_tokens} tokens")  # fmt: skip
    print(
        "| prompt tokens | colocated goodput/s | disaggregated goodput/s | split | disaggregated / colocated | colocated bottleneck | disaggregated bottleneck |"
    )
    print("|---:|---:|---:|---|---:|---|---|")
    for r in rows:
        c, d = r["colocated"] or {}, r["disaggregated"] or {}
        split = f"{d['prefill_workers']}P:{d['decode_workers']}D" if d else "-"
        ratio = r["disaggregated_over_colocated"]
        print(f"| {r['input_tokens']:,} | {c.get('goodput_rps', 0.0):.2f} | {d.get('goodput_rps', 0.0):.2f} | {split} | "
              f"{'-' if ratio is None else f'{ratio:.2f}x'} | {c.get('bottleneck', '-')} | {d.get('bottleneck', '-')} |")  # fmt: skip
    return 0


def write_plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    xs = [r["input_tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in ("colocated", "disaggregated"):
        ax.plot(xs, [(r[name] or {}).get("goodput_rps", 0.0) for r in rows], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("requests/s within TTFT and TPOT objectives")
    h = result["hardware"]
    ax.set_title(f"{h['model']} on {result['workers']} x {h['tp']} {h['gpu']}: colocated vs disaggregated")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
