"""`kvplane sim`: the whole cluster in virtual time, per routing and admission policy.

One command, one table: for each load level (a trace speed, a rate, or a multiple of the
capacity a closed loop measures first), routing policy and admission policy, a fresh simulated
cluster (kvplane.apps.sim.simulator) runs the workload and reports the benchmarks' rows
(kvplane.apps.sim.report). Progress goes to stderr; `--json` prints {"config", "rows"} only, identical
for identical arguments and seeds. `--planner-cost` adds the planner's own wall-clock cost per
decision (route + admit), which naturally differs between runs, under "planner_cost".
`--grid` runs the decision grid instead (kvplane.apps.sim.grid): every cell group of issue 22,
every routing policy, kvplane judged against the peers' rules.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from kvplane.apps.bench.load import parse_floats
from kvplane.apps.bench.workload import PRIORITY_INTERACTIVE
from kvplane.apps.sim import grid, workloads
from kvplane.apps.sim.decisions import DecisionLog
from kvplane.apps.sim.fleet import AgentTiming
from kvplane.apps.sim.sweep import Sweep, level_row
from kvplane.controlplane.core.admission import admission_policy_names
from kvplane.controlplane.core.planner import PlannerConfig
from kvplane.controlplane.core.policies import routing_policy_names
from kvplane.controlplane.core.settings import DEFAULT_OBJECTIVES
from kvplane.controlplane.flags import add_config_arguments
from kvplane.dataplane.engines.sim import SimConfig
from kvplane.dataplane.engines.sim import plugin as sim_plugin

ROW_COLUMNS = (  # (key, header, format) of the text table
    ("level", "load", "{}"), ("routing", "routing", "{}"), ("admission", "admission", "{}"),
    ("offered_rps", "offered/s", "{:.2f}"), ("rejected", "rejected", "{}"), ("goodput_rps", "goodput/s", "{:.2f}"),
    ("attainment", "attain", "{:.1%}"), ("ttft_p50_ms", "TTFT p50", "{:.0f}"), ("ttft_p99_ms", "TTFT p99", "{:.0f}"),
    ("tpot_p50_ms", "TPOT p50", "{:.1f}"), ("tpot_p99_ms", "TPOT p99", "{:.1f}"), ("hit_rate", "hit", "{:.3f}"),
    ("oracle_hit_rate", "oracle", "{:.3f}"), ("max_load_over_mean", "max/mean", "{:.2f}"),
    ("kv_bytes_moved", "KV moved", "{}"), ("goodput_vs_baseline", "goodput vs base", "{:.2f}x"),
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    w = parser.add_argument_group("workload")
    w.add_argument(
        "--workload", choices=workloads.WORKLOADS, default="trace", help="what arrives (default %(default)s: the bundled Mooncake trace)"
    )
    w.add_argument("--trace", default="", metavar="FILE", help="a Mooncake-format trace (default: the bundled one)")
    w.add_argument("--requests", type=int, default=0, metavar="N", help="trace: the first N requests only (default: all)")
    w.add_argument("--speed", type=lambda t: parse_floats(t, "--speed"), default=[1.0], metavar="F,F",
                   help="trace, chat, agent, rag: time divided by F, one level per value (default 1)")  # fmt: skip
    w.add_argument("--rate", type=lambda t: parse_floats(t, "--rate"), default=None, metavar="RPS,RPS",
                   help="mix/synthetic: arrival rates, one level per value")  # fmt: skip
    w.add_argument("--load-factors", type=lambda t: parse_floats(t, "--load-factors"), default=None, metavar="F,F",
                   help="mix/synthetic: rates as multiples of the capacity a closed loop measures first")  # fmt: skip
    w.add_argument(
        "--duration", type=float, default=0.0, metavar="S", help="seconds of arrivals (trace: a window; mix/synthetic: default 60)"
    )
    w.add_argument(
        "--mix-scale", type=float, default=1.0, metavar="F", help="mix: every token count x F (as `kvplane bench load --mix-scale`)"
    )
    w.add_argument("--input-tokens", default="1024", metavar="N|LO-HI", help="synthetic: prompt tokens (default %(default)s)")
    w.add_argument("--output-tokens", default="128", metavar="N|LO-HI", help="synthetic: output tokens (default %(default)s)")
    w.add_argument("--prefix-share", type=float, default=0.0, metavar="F", help="synthetic: share of each prompt that is a shared prefix")
    w.add_argument("--capacity-concurrency", type=int, default=0, metavar="N",
                   help="closed loop for --load-factors: requests in flight (default 64 per decode-capable worker)")  # fmt: skip
    w.add_argument("--seed", type=int, default=0, help="seed of the workload, the planner's draws and the engines' tokens (default 0)")

    c = parser.add_argument_group("cluster")
    c.add_argument("--prefill", type=int, default=0, metavar="N", help="prefill workers (default %(default)s)")
    c.add_argument("--decode", type=int, default=0, metavar="N", help="decode workers (default %(default)s)")
    c.add_argument("--both", type=int, default=0, metavar="N", help="workers that prefill and decode (default: 8 when no count is given)")
    c.add_argument("--block-size", type=int, default=SimConfig().block_size, help="tokens per KV block (default %(default)s)")
    c.add_argument("--max-tokens-limit", type=int, default=SimConfig().max_tokens_limit, help="largest max_tokens (default %(default)s)")
    c.add_argument("--hop-ms", type=float, default=AgentTiming().hop_s * 1000, help="one RPC's one-way latency in ms (default %(default)s)")
    sim_plugin.add_hardware_arguments(parser.add_argument_group("simulated hardware (the sim engine's flags)"), host_size_list=True)
    add_config_arguments(parser.add_argument_group("control plane (kvplane controlplane's flags)"), PlannerConfig())
    # The planner's first link rate and its tier load rates are the simulated hardware's (a live
    # control plane is told them by these flags): predictions start from the hardware, not from a
    # default to learn away from.
    for dest, help_text in (
        ("initial_link_gb_per_s", "KV transfer rate predictions assume until transfers are measured, GB/s (default: the simulated link's)"),
        ("host_load_gb_per_s", "kvplane policy: rate of loading cached KV blocks from host memory, GB/s (default: the simulated worker's)"),
        ("disk_load_gb_per_s", "kvplane policy: rate of loading cached KV blocks from disk, GB/s (default: the simulated worker's)"),
    ):
        action = next(a for a in parser._actions if a.dest == dest)
        action.default, action.help = None, help_text

    p = parser.add_argument_group("comparison and output")
    p.add_argument("--compare-routing", type=_names(routing_policy_names()), default=None, metavar="P,P",
                   help=f"routing policies to compare (of {', '.join(routing_policy_names())}; default: --routing-policy)")  # fmt: skip
    p.add_argument("--compare-admission", type=_names(admission_policy_names()), default=None, metavar="P,P",
                   help=f"admission policies to compare (of {', '.join(admission_policy_names())}; default: --admission)")  # fmt: skip
    p.add_argument(
        "--ttft-ms",
        type=float,
        default=DEFAULT_OBJECTIVES[PRIORITY_INTERACTIVE].ttft_ms,
        help="interactive TTFT objective (default %(default)s)",
    )
    p.add_argument(
        "--tpot-ms",
        type=float,
        default=DEFAULT_OBJECTIVES[PRIORITY_INTERACTIVE].tpot_ms,
        help="interactive TPOT objective (default %(default)s)",
    )
    p.add_argument("--planner-cost", action="store_true", help="measure the planner's CPU time per decision (not deterministic)")
    p.add_argument("--compare-processes", action="store_true",
                   help="also run each level on real processes (a control plane and sim agents, `kvplane up --engine sim`) and report both")  # fmt: skip
    p.add_argument(
        "--speedup", type=float, default=1.0, help="--compare-processes: the agents' simulated seconds per wall second (default 1)"
    )
    p.add_argument("--grid", action="store_true",
                   help="the decision grid (kvplane.apps.sim.grid): every cell group, every routing policy, kvplane judged against the peers")  # fmt: skip
    p.add_argument("--grid-groups", type=_names(grid.GROUP_NAMES), default=None, metavar="G,G",
                   help=f"--grid: only these cell groups (of {', '.join(grid.GROUP_NAMES)}; default all)")  # fmt: skip
    p.add_argument("--json", action="store_true", help='print {"config": ..., "rows": [...]} only')
    p.add_argument("--decisions", default="", metavar="FILE.jsonl",
                   help="write every decision of every run as a JSON line: each candidate's cost (kvplane's rule: its predicted "
                        "seconds), the choice and why, admission's verdict and prediction, and what was measured (decisions.py)")  # fmt: skip
    p.add_argument("--plot", default="", metavar="FILE.png",
                   help="write goodput and attainment against offered load; with --grid, each group's TTFT p99 and goodput per level "
                        "and policy (needs matplotlib)")  # fmt: skip


def _names(known: tuple[str, ...] | list[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {unknown or text!r}; choose from {', '.join(known)}")
        return names

    return parse


def run_sweep(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    sweep = Sweep(args, log)
    levels, capacity = sweep.levels()
    rows = []
    for level in levels:
        baseline = None
        # One row per policy pair and host size (--host-gib N,N); the level's first row is the baseline.
        for routing, admission, fleet in itertools.product(sweep.routings, sweep.admissions, sweep.fleets):
            host = f", host {fleet.engine.host_gib:g} GiB" if len(sweep.fleets) > 1 else ""
            log(f"[{level.label} {routing}/{admission}{host}] {len(level.requests)} requests on {fleet.num_workers} workers ...")
            row = level_row(sweep, level, routing, admission, fleet)
            if baseline is None:
                baseline = row["goodput_rps"]
            row["goodput_vs_baseline"] = round(row["goodput_rps"] / baseline, 4) if baseline else None
            if args.compare_processes:
                real = sweep.processes(level, routing, admission, row["oracle_hit_rate"])
                row["processes"] = real
                row["processes_error"] = {k: _relative_error(row[k], real[k]) for k in AGREEMENT_KEYS}
            rows.append(row)
    return {"config": sweep.config(capacity), "rows": rows}


AGREEMENT_KEYS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "goodput_rps", "attainment", "hit_rate")


def _relative_error(virtual: float | None, processes: float | None) -> float | None:
    """(virtual - processes) / processes: how far the simulation is from the real run."""
    if virtual is None or not processes:
        return None
    return round((virtual - processes) / processes, 4)


def format_agreement(result: dict[str, Any]) -> str:
    headers = ["load", "routing/admission", *(f"{k} virtual / processes (error)" for k in AGREEMENT_KEYS), "idle overhead ms"]
    lines = [" | ".join(headers), " | ".join("---" for _ in headers)]
    for r in result["rows"]:
        if "processes" not in r:
            continue
        cells = [r["level"], f"{r['routing']}/{r['admission']}"]
        for k in AGREEMENT_KEYS:
            v, p, e = r[k], r["processes"][k], r["processes_error"][k]
            cells.append("-" if v is None or p is None else f"{v:.3g} / {p:.3g} ({'-' if e is None else f'{e:+.1%}'})")
        cells.append(f"{r['processes']['idle_overhead_ms']:.1f}")
        lines.append(" | ".join(cells))
    return "\n".join(f"| {line} |" for line in lines)


# With a host tier: the size per row, the hit rate by tier and the bound of a cache that never evicts.
TIER_COLUMNS = (
    ("host_gib", "host GiB", "{:g}"), ("hit_device", "hit device", "{:.3f}"), ("hit_host", "hit host", "{:.3f}"),
    ("hit_disk", "hit disk", "{:.3f}"),
)  # fmt: skip
INFINITE_COLUMN = ("infinite_hit_rate", "infinite", "{:.3f}")


def table_columns(result: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
    if not any(r.get("host_gib") for r in result["rows"]):
        return ROW_COLUMNS
    at = next(i for i, c in enumerate(ROW_COLUMNS) if c[0] == "hit_rate")
    oracle = next(i for i, c in enumerate(ROW_COLUMNS) if c[0] == "oracle_hit_rate")
    return (*ROW_COLUMNS[:at], TIER_COLUMNS[0], ROW_COLUMNS[at], *TIER_COLUMNS[1:], *ROW_COLUMNS[at + 1 : oracle + 1], INFINITE_COLUMN,
            *ROW_COLUMNS[oracle + 1 :])  # fmt: skip


def format_table(result: dict[str, Any]) -> str:
    columns = table_columns(result)
    lines = [" | ".join(h for _, h, _ in columns), " | ".join("---" for _ in columns)]
    for r in result["rows"]:
        cells = []
        for key, _, fmt in columns:
            value = r.get(key)
            cells.append("-" if value is None else fmt.format(value) if key != "kv_bytes_moved" else f"{value / 1e9:.1f} GB")
        lines.append(" | ".join(cells))
    return "\n".join(f"| {line} |" for line in lines)


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if not args.decisions:
        return _run(args, log)
    try:
        out = open(args.decisions, "w", encoding="utf-8")  # noqa: SIM115 - closed below, after every run
    except OSError as e:
        print(f"kvplane sim: cannot write --decisions {args.decisions}: {e}", file=sys.stderr)
        return 2
    with out:
        args.decision_log = DecisionLog(out)
        code = _run(args, log)
    log(f"{args.decision_log.num_lines} decisions written to {args.decisions}")
    return code


def _run(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    if args.grid:
        return grid.run(args, log)

    started = time.monotonic()
    try:
        result = run_sweep(args, log)
    except ValueError as e:
        print(f"kvplane sim: {e}", file=sys.stderr)
        return 2
    log(f"done in {time.monotonic() - started:.0f} s")
    if args.plot:
        from kvplane.apps.bench.load import write_plot

        rows = [dict(r, policy=f"{r['routing']}/{r['admission']}", attainment=r["attainment"]) for r in result["rows"]]
        write_plot({"rows": rows, "capacity_rps": result["config"]["capacity_rps"] or 0.0}, args.plot)
        log(f"plot written to {args.plot}")
    if args.json:
        print(json.dumps(result))
        return 0
    c = result["config"]
    print(f"{c['model']} on {c['tp']} x {c['gpu']} per worker, {c['prefill']} prefill / {c['decode']} decode / {c['both']} both, "
          f"KV over {c['link']}; objectives TTFT {c['objectives_ms']['interactive']['ttft_ms']:g} ms, "
          f"TPOT {c['objectives_ms']['interactive']['tpot_ms']:g} ms"
          + (f"; capacity {c['capacity_rps']:.2f} requests/s" if c["capacity_rps"] else ""))  # fmt: skip
    print(format_table(result))
    if args.compare_processes:
        print("\nthe same workload on real processes (sim agents), and the simulation's error against them:")
        print(format_agreement(result))
    for r in result["rows"]:
        if "planner_cost" in r:
            p = r["planner_cost"]
            print(f"planner cost [{r['level']} {r['routing']}/{r['admission']}]: p50 {p['p50_us']:.0f} us, p99 {p['p99_us']:.0f} us "
                  f"per decision ({p['decisions']} decisions, {p['workers']} workers, {p['index_block_hashes']} block hashes indexed)")  # fmt: skip
    return 0
