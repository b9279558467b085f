"""`kvplane sim`: the whole cluster in virtual time, per routing and admission policy.

One command, one table: for each load level (a trace speed, a rate, or a multiple of the
capacity a closed loop measures first), routing policy and admission policy, a fresh simulated
cluster (kvplane.apps.sim.simulator) runs the workload and reports the benchmarks' rows
(kvplane.apps.sim.report). Progress goes to stderr; `--json` prints {"config", "rows"} only, identical
for identical arguments and seeds. `--planner-cost` adds the planner's own wall-clock cost per
decision (route + admit), which naturally differs between runs, under "planner_cost".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from kvplane import hardware
from kvplane.apps.bench.load import BATCH_OBJECTIVE_FACTOR, parse_floats
from kvplane.apps.bench.workload import PRIORITY_BATCH, PRIORITY_INTERACTIVE, MixConfig
from kvplane.apps.sim import report, workloads
from kvplane.apps.sim.fleet import AgentTiming
from kvplane.apps.sim.simulator import FleetSpec, RunResult, SimRequest, Simulator
from kvplane.controlplane.core.admission import admission_policy_names
from kvplane.controlplane.core.planner import PlannerConfig
from kvplane.controlplane.core.policies import routing_policy_names
from kvplane.controlplane.core.settings import DEFAULT_OBJECTIVES, ClusterSettings
from kvplane.controlplane.flags import add_config_arguments
from kvplane.controlplane.flags import config_from_args as planner_from_args
from kvplane.dataplane.engines.sim import SimConfig
from kvplane.dataplane.engines.sim import plugin as sim_plugin
from kvplane.latency import prefill_attention
from kvplane.types import Objective

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
    sim_plugin.add_hardware_arguments(parser.add_argument_group("simulated hardware (the sim engine's flags)"))
    add_config_arguments(parser.add_argument_group("control plane (kvplane controlplane's flags)"), PlannerConfig())
    # The planner's first link rate is the simulated link's (a live control plane is told it by
    # the flag): predictions start from the hardware, not from a default to learn away from.
    link_rate = next(a for a in parser._actions if a.dest == "initial_link_gb_per_s")
    link_rate.default, link_rate.help = (
        None,
        "KV transfer rate predictions assume until transfers are measured, GB/s (default: the simulated link's)",
    )

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
    p.add_argument("--json", action="store_true", help='print {"config": ..., "rows": [...]} only')
    p.add_argument("--plot", default="", metavar="FILE.png", help="write goodput and attainment against offered load (needs matplotlib)")


def _names(known: tuple[str, ...] | list[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {unknown or text!r}; choose from {', '.join(known)}")
        return names

    return parse


def length_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise ValueError(f"expected N or LO-HI tokens, got {text!r}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class Level:
    label: str
    requests: list[SimRequest]
    window_s: float
    load_factor: float | None = None


class Sweep:
    """The runs of one command: fleet, planner configs per policy, objectives, levels."""

    def __init__(self, args: argparse.Namespace, log: Callable[[str], None]) -> None:
        self.args = args
        self.log = log
        engine = sim_plugin.hardware_config_from_args(args)
        if args.prefill + args.decode + args.both == 0:
            args.both = 8
        self.fleet = FleetSpec(engine, args.prefill, args.decode, args.both).validate()
        if args.initial_link_gb_per_s is None:
            args.initial_link_gb_per_s = hardware.link(engine.link).bits_per_s / 8e9
        self.spec = hardware.model(engine.model)
        interactive = Objective(args.ttft_ms, args.tpot_ms)
        self.objectives = {
            PRIORITY_INTERACTIVE: interactive,
            PRIORITY_BATCH: Objective(interactive.ttft_ms * BATCH_OBJECTIVE_FACTOR, interactive.tpot_ms * BATCH_OBJECTIVE_FACTOR),
        }
        values = {f"objectives.*.{p}.{k}": f"{getattr(o, k):g}" for p, o in self.objectives.items() for k in ("ttft_ms", "tpot_ms")}
        self.settings = ClusterSettings(values)
        self.agent = AgentTiming(hop_s=args.hop_ms / 1000)
        base = planner_from_args(args, PlannerConfig())
        self.routings = args.compare_routing or [base.router.policy_name]
        self.admissions = args.compare_admission or [base.admission_policy]

    def planner_config(self, routing: str, admission: str) -> PlannerConfig:
        args = argparse.Namespace(**vars(self.args))
        args.routing_policy = routing
        args.admission = admission
        return planner_from_args(args, PlannerConfig())

    def simulate(self, requests: list[SimRequest], routing: str, admission: str, label: str, until_s: float | None = None) -> RunResult:
        started, cpu_started = time.monotonic(), time.process_time()
        n = len(requests)

        def progress(sim: Simulator) -> None:
            self.log(f"  [{label} {routing}/{admission}] {sim.num_ended}/{n} requests ended, "
                     f"virtual {sim.loop.now:.0f} s, wall {time.monotonic() - started:.0f} s, CPU {time.process_time() - cpu_started:.0f} s")  # fmt: skip

        sim = Simulator(
            self.fleet, self.planner_config(routing, admission), self.settings, seed=self.args.seed, agent=self.agent,
            measure_cost=self.args.planner_cost, progress=progress,
        )  # fmt: skip
        result = sim.run(requests, until_s)
        self.log(f"  [{label} {routing}/{admission}] done: {n} requests, virtual {result.duration_s:.0f} s, {result.num_events} events, "
                 f"wall {time.monotonic() - started:.1f} s, CPU {time.process_time() - cpu_started:.1f} s (this process, one core)")  # fmt: skip
        return result

    def processes(self, level: Level, routing: str, admission: str, oracle_hit_rate: float) -> dict[str, Any]:
        """The level replayed on a local cluster of sim agents (real processes); its row, with
        `idle_overhead_ms`: the median TTFT of five 16-token requests sent first, less what the
        simulation gives them (one short step and two hops), i.e. what the processes add here."""
        import asyncio

        from kvplane.apps.cluster import LocalCluster
        from kvplane.apps.sim.replay import replay
        from kvplane.client import Client

        a, fleet = self.args, self.fleet
        engine = dataclasses.replace(fleet.engine, speedup=a.speedup)
        cp_args = [
            "--routing-policy",
            routing,
            "--admission",
            admission,
            "--disagg-threshold",
            str(self.planner_config(routing, admission).router.disagg_threshold_tokens),
        ]
        self.log(f"  [{level.label} {routing}/{admission}] on processes: {fleet.num_workers} sim agents (speedup {a.speedup:g}) ...")
        cluster = LocalCluster(
            num_prefill=fleet.num_prefill, num_decode=fleet.num_decode, num_both=fleet.num_both,
            agent_args=[*sim_plugin.agent_args(engine), "--transports", "grpc"], controlplane_args=cp_args,
            startup_timeout=300.0,
        )  # fmt: skip
        with cluster:
            with Client(cluster.endpoint) as client:
                for key, value in self.settings.values.items():  # objectives in wall milliseconds
                    client.set_config(key, f"{float(value) / a.speedup:g}")
                # What the processes add on this machine: tiny requests whose engine time is one short step.
                probe = [client.generate(list(range(1 + i, 17 + i)), max_tokens=1, disagg="never").metrics.ttft_ms for i in range(5)]
            records, loads, duration = asyncio.run(replay(cluster.endpoint, level.requests, speedup=a.speedup, log=self.log))
        row = report.records_row(records, [loads[w] for w in sorted(loads)], duration, level.window_s, self.objectives)
        row["oracle_hit_rate"] = oracle_hit_rate  # a property of the workload and the fleet's capacity
        engine_ms = (self.fleet.engine.timing().step_seconds(16, prefill_attention(16, 0)) + 2 * self.agent.hop_s) * 1000
        row["idle_overhead_ms"] = round(sorted(probe)[len(probe) // 2] * a.speedup - engine_ms, 2)
        return row

    def capacity(self) -> float:
        """Requests completed per virtual second by a closed loop (admission none), after warm-up."""
        a = self.args
        concurrency = a.capacity_concurrency or 64 * (self.fleet.num_decode + self.fleet.num_both)
        requests = self.workload_requests(rate=None, closed_concurrency=concurrency)
        horizon = 60.0
        self.log(f"capacity: closed loop, {concurrency} in flight for {horizon:g} virtual s ...")
        result = self.simulate(requests, self.routings[0], "none", "capacity", until_s=horizon)
        warm = horizon / 4
        done = [r for r in result.records if r.finished_s is not None and warm <= r.finished_s <= horizon and not r.failed]
        capacity = len(done) / (horizon - warm)
        self.log(f"capacity {capacity:.2f} requests/s")
        return capacity

    def workload_requests(self, rate: float | None, closed_concurrency: int = 0) -> list[SimRequest]:
        a = self.args
        duration = a.duration or 60.0
        if closed_concurrency:
            if a.workload == "synthetic":
                pool = workloads.synthetic(self.synthetic_spec(), 1000.0, closed_concurrency, a.seed, self.spec.vocab_size)
                return [
                    dataclasses.replace(
                        pool[(i * 7919) % len(pool)], arrival_s=0.0, after=i - closed_concurrency if i >= closed_concurrency else -1
                    )
                    for i in range(closed_concurrency * 64)
                ]
            return workloads.closed(closed_concurrency, 64, a.seed, MixConfig().scaled(a.mix_scale))
        if a.workload == "mix":
            return workloads.mix(rate, duration, a.seed, MixConfig().scaled(a.mix_scale))
        return workloads.synthetic(self.synthetic_spec(), rate, duration, a.seed, self.spec.vocab_size)

    def synthetic_spec(self) -> workloads.SyntheticSpec:
        a = self.args
        spec = workloads.SyntheticSpec(length_range(a.input_tokens), length_range(a.output_tokens), a.prefix_share).validate()
        return spec.check_fits(self.spec.key, self.spec.max_context)

    def levels(self) -> tuple[list[Level], float | None]:
        a = self.args
        if a.workload == "trace":
            out = []
            for speed in a.speed:
                requests = workloads.trace(
                    a.trace or None, speed=speed, duration_s=a.duration or None, max_requests=a.requests or None,
                    max_context=self.spec.max_context, vocab_size=self.spec.vocab_size,
                )  # fmt: skip
                window = requests[-1].arrival_s if requests else 0.0
                out.append(Level(f"speed {speed:g}", requests, max(window, 1e-9)))
            return out, None
        if a.workload in workloads.PREFIX_WORKLOADS:
            out = []
            for speed in a.speed:
                requests = [dataclasses.replace(r, arrival_s=r.arrival_s / speed) for r in workloads.prefix(a.workload, a.seed)]
                out.append(Level(f"{a.workload} x{speed:g}", requests, max(r.arrival_s for r in requests)))
            return out, None
        capacity = None
        if a.load_factors:
            capacity = self.capacity()
            rates = [(f"x{f:g}", f * capacity, f) for f in a.load_factors]
        else:
            rates = [(f"{r:g}/s", r, None) for r in (a.rate or [1.0])]
        duration = a.duration or 60.0
        return [Level(label, self.workload_requests(rate), duration, factor) for label, rate, factor in rates], capacity

    def config(self, capacity: float | None) -> dict[str, Any]:
        e = self.fleet.engine
        return {
            "workload": self.args.workload,
            "gpu": hardware.gpu(e.gpu).key, "model": self.spec.key, "tp": e.tp, "link": hardware.link(e.link).key,
            "timing": "profile" if e.profile else "roofline", "block_size": e.block_size,
            "prefill": self.fleet.num_prefill, "decode": self.fleet.num_decode, "both": self.fleet.num_both,
            "kv_blocks_per_worker": e.total_blocks(), "kv_bytes_per_token": self.spec.kv_bytes_per_token,
            "objectives_ms": {p: dataclasses.asdict(o) for p, o in self.objectives.items()},
            "capacity_rps": None if capacity is None else round(capacity, 4), "seed": self.args.seed,
        }  # fmt: skip


def run_sweep(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    sweep = Sweep(args, log)
    levels, capacity = sweep.levels()
    rows = []
    for level in levels:
        baseline = None
        for routing in sweep.routings:
            for admission in sweep.admissions:
                log(f"[{level.label} {routing}/{admission}] {len(level.requests)} requests on {sweep.fleet.num_workers} workers ...")
                result = sweep.simulate(level.requests, routing, admission, level.label)
                row: dict[str, Any] = {"level": level.label, "load_factor": level.load_factor, "routing": routing, "admission": admission}
                row.update(report.row(result, level.window_s, sweep.objectives))
                if baseline is None:
                    baseline = row["goodput_rps"]
                row["goodput_vs_baseline"] = round(row["goodput_rps"] / baseline, 4) if baseline else None
                if args.planner_cost:
                    row["planner_cost"] = report.planner_cost(result, sweep.fleet.num_workers)
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


def format_table(result: dict[str, Any]) -> str:
    lines = [" | ".join(h for _, h, _ in ROW_COLUMNS), " | ".join("---" for _ in ROW_COLUMNS)]
    for r in result["rows"]:
        cells = []
        for key, _, fmt in ROW_COLUMNS:
            value = r.get(key)
            cells.append("-" if value is None else fmt.format(value) if key != "kv_bytes_moved" else f"{value / 1e9:.1f} GB")
        lines.append(" | ".join(cells))
    return "\n".join(f"| {line} |" for line in lines)


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

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
