"""A `kvplane sim` sweep: the fleet, the planner config per policy, the objectives and the load
levels of one command, and one simulated run per level and policy pair (`level_row`). Shared by
`kvplane sim` (main.py), its decision grid (grid.py) and `kvplane plan` (plan.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from kvplane import hardware
from kvplane.apps.bench.load import BATCH_OBJECTIVE_FACTOR
from kvplane.apps.bench.workload import PRIORITY_BATCH, PRIORITY_INTERACTIVE, MixConfig
from kvplane.apps.sim import report, workloads
from kvplane.apps.sim.decisions import DecisionLog
from kvplane.apps.sim.fleet import AgentTiming
from kvplane.apps.sim.simulator import FleetSpec, RunResult, SimRequest, Simulator
from kvplane.controlplane.core.planner import PlannerConfig
from kvplane.controlplane.core.settings import ClusterSettings
from kvplane.controlplane.flags import config_from_args as planner_from_args
from kvplane.dataplane.engines.sim import plugin as sim_plugin
from kvplane.latency import prefill_attention
from kvplane.types import Objective


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
        if getattr(args, "host_load_gb_per_s", None) is None:
            args.host_load_gb_per_s = engine.host_load_bytes_per_s() / 1e9
        if getattr(args, "disk_load_gb_per_s", None) is None:
            args.disk_load_gb_per_s = engine.disk_load_bytes_per_s() / 1e9
        # --host-gib N,N: one fleet per host size, each run per level and policy pair.
        sizes = args.sim_host_gib if isinstance(args.sim_host_gib, list) else [args.sim_host_gib]
        self.fleets = [dataclasses.replace(self.fleet, engine=dataclasses.replace(engine, host_gib=g)).validate() for g in sizes]
        self.spec = hardware.model(engine.model)
        interactive = Objective(args.ttft_ms, args.tpot_ms)
        self.objectives = {
            PRIORITY_INTERACTIVE: interactive,
            PRIORITY_BATCH: Objective(interactive.ttft_ms * BATCH_OBJECTIVE_FACTOR, interactive.tpot_ms * BATCH_OBJECTIVE_FACTOR),
        }
        values = {f"objectives.*.{p}.{k}": f"{getattr(o, k):g}" for p, o in self.objectives.items() for k in ("ttft_ms", "tpot_ms")}
        self.settings = ClusterSettings(values)
        self.agent = AgentTiming(hop_s=args.hop_ms / 1000)
        self.decisions: DecisionLog | None = getattr(args, "decision_log", None)  # --decisions (decisions.py)
        base = planner_from_args(args, PlannerConfig())
        self.routings = args.compare_routing or [base.router.policy_name]
        self.admissions = args.compare_admission or [base.admission_policy]

    def planner_config(self, routing: str, admission: str) -> PlannerConfig:
        args = argparse.Namespace(**vars(self.args))
        args.routing_policy = routing
        args.admission = admission
        return planner_from_args(args, PlannerConfig())

    def simulate(
        self, requests: list[SimRequest], routing: str, admission: str, label: str, until_s: float | None = None,
        fleet: FleetSpec | None = None,
    ) -> RunResult:  # fmt: skip
        started, cpu_started = time.monotonic(), time.process_time()
        n = len(requests)

        def progress(sim: Simulator) -> None:
            self.log(f"  [{label} {routing}/{admission}] {sim.num_ended}/{n} requests ended, "
                     f"virtual {sim.loop.now:.0f} s, wall {time.monotonic() - started:.0f} s, CPU {time.process_time() - cpu_started:.0f} s")  # fmt: skip

        sim = Simulator(
            fleet or self.fleet, self.planner_config(routing, admission), self.settings, seed=self.args.seed, agent=self.agent,
            measure_cost=self.args.planner_cost, progress=progress,
            decisions=None if self.decisions is None else self.decisions.sink(
                level=label, routing=routing, admission=admission,
                **({"host_gib": f"{fleet.engine.host_gib:g}"} if fleet is not None and len(self.fleets) > 1 else {}),
            ),
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
            "host_gib": [f.engine.host_gib for f in self.fleets], "disk_gib": e.disk_gib,
            "host_gb_per_s_per_worker": e.host_load_bytes_per_s() / 1e9, "disk_gb_per_s": e.disk_gb_per_s,
            "objectives_ms": {p: dataclasses.asdict(o) for p, o in self.objectives.items()},
            "capacity_rps": None if capacity is None else round(capacity, 4), "seed": self.args.seed,
        }  # fmt: skip


def level_row(sweep: Sweep, level: Level, routing: str, admission: str, fleet: FleetSpec | None = None) -> dict[str, Any]:
    """One simulated run of `level` with these policies (on `fleet`, default the sweep's first):
    its row (report.row, with the level and the host tier's size)."""
    fleet = fleet or sweep.fleet
    label = f"{level.label}, host {fleet.engine.host_gib:g} GiB" if len(sweep.fleets) > 1 else level.label
    result = sweep.simulate(level.requests, routing, admission, label, fleet=fleet)
    row: dict[str, Any] = {"level": level.label, "load_factor": level.load_factor, "routing": routing, "admission": admission,
                           "host_gib": fleet.engine.host_gib}  # fmt: skip
    row.update(report.row(result, level.window_s, sweep.objectives))
    if sweep.args.planner_cost:
        row["planner_cost"] = report.planner_cost(result, sweep.fleet.num_workers)
    return row
