"""Commands whose arguments and behaviour live in other packages: the servers and the benchmarks.

`kvplane controlplane`, `kvplane agent` and `kvplane bench ...` import their module
only when run, so that client commands start fast and never import torch. Each module
provides `add_arguments(parser) -> None` and `run(args) -> int`; all arguments after the
command name go to the module's own parser (its --help included). The servers also read their
flags from `--config FILE.yaml` and KVPLANE_* environment variables (flag_sources.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from types import ModuleType

from kvplane.apps.cli import flag_sources
from kvplane.apps.cli.common import EXIT_USAGE, extra_needed, import_extra, usage_error


@dataclass(frozen=True, slots=True)
class Delegate:
    command: tuple[str, ...]  # e.g. ("bench", "transfer")
    module: str
    help: str
    description: str
    server: bool = False  # a long-running server: flags from a config file and the environment too
    extra: str = "server,reference,bench"  # what to install for it beyond the SDK's base (pyproject's extras)

    @property
    def prog(self) -> str:
        return "kvplane " + " ".join(self.command)


DELEGATES = (
    Delegate(
        ("controlplane",), "kvplane.controlplane.main", "run a control plane server",
        "Runs one control-plane replica: the client API, registry, router and admission control.", server=True, extra="server",
    ),
    Delegate(
        ("agent",), "kvplane.dataplane.agent.main", "run a data-plane agent beside an engine",
        "Runs a data-plane agent: registers with a control plane, serves Generate/Prefill/KV pulls.", server=True,
        extra="agent,reference",
    ),
    Delegate(
        ("sim",), "kvplane.apps.sim.main", "simulate the whole cluster in virtual time",
        "Runs the real planner against simulated GPU workers (the sim engine) in virtual time, per routing and "
        "admission policy, and reports the benchmarks' rows: hit rate, TTFT/TPOT, goodput, attainment, load spread.",
    ),
    Delegate(
        ("plan",), "kvplane.apps.sim.plan", "colocated or disaggregated, and how many workers, for a model, GPU and workload",
        "Answers with numbers, by simulating candidate configurations: colocated or disaggregated, the prefill:decode "
        "split and worker count for a target rate (or the most requests/s a worker budget serves within the objectives), "
        "expected TTFT/TPOT, KV bytes per request and transfer time per link, and the bottleneck.",
    ),
    Delegate(
        ("bench", "transfer"), "kvplane.apps.bench.transfer", "measure KV transfer throughput",
        "Measures KV-block transfer throughput and latency between two processes per transport.",
    ),
    Delegate(
        ("bench", "load"), "kvplane.apps.bench.load", "goodput of admission policies under open-loop load",
        "Drives a local cluster with an open-loop Poisson arrival process (or a replayed trace) at "
        "multiples of its measured capacity, once per admission policy, and reports goodput, objective "
        "attainment, TTFT/TPOT percentiles and the TTFT prediction error.",
    ),
    Delegate(
        ("bench", "disagg"), "kvplane.apps.bench.disagg", "colocated vs disaggregated goodput as prompts grow (simulated)",
        "For each prompt length, the most requests/s within the latency objectives that N colocated workers serve, and "
        "the same for the best prefill:decode split of N workers, by simulation (kvplane plan's search): DistServe's comparison.",
    ),
    Delegate(
        ("bench", "calibrate"), "kvplane.apps.bench.calibrate", "the simulator's unloaded TTFT against a profiled reference engine",
        "Profiles a reference-engine agent, measures its unloaded TTFT per prompt length, and compares what "
        "`kvplane sim --sim-profile` predicts for the same requests.",
    ),
    Delegate(
        ("bench", "tracing"), "kvplane.apps.bench.tracing", "measure the cost of tracing on the generate path",
        "Runs the same requests against a cluster with tracing off and one with tracing on, and compares latency.",
    ),
    Delegate(
        ("bench", "tiers"), "kvplane.apps.bench.tiers", "measure KV block load time per tier vs recompute",
        "Measures host->device and disk->device KV block loads against recomputing the block (prefill).",
    ),
    Delegate(
        ("bench", "routing"), "kvplane.apps.bench.routing", "what planning one request costs as the fleet grows",
        "Plans requests in process (router, policy, admission, predictions, ledger) over fleets of 100 to 1,000 "
        "workers with 1,000 indexed blocks each, and reports route-and-admit p50/p99 against pricing every worker.",
    ),
    Delegate(
        ("bench", "index"), "kvplane.apps.bench.index", "what keeping the cache index costs per worker (events, snapshots)",
        "Applies workers' KV events and periodic snapshots to the cache index in process and reports what each costs, "
        "against a worker's first snapshot, and the cores 1,000 such workers' snapshots take a replica.",
    ),
    Delegate(
        ("bench", "controlplane"), "kvplane.apps.bench.controlplane", "highest request rate 1, 2, 4 control-plane replicas sustain",
        "Starts 1, 2 and 4 control-plane replicas on one etcd in front of 128 simulated workers, searches the highest "
        "open-loop request rate each sustains (no errors, routing p99 under 5 ms) for short and long requests, and "
        "reports CPU per request and its shares: routing, admission, relay, gRPC and the rest.",
    ),
    Delegate(
        ("bench", "prefix"), "kvplane.apps.bench.prefix", "compare routing policies on prefix-sharing workloads",
        "Replays chat/agent/rag/trace workloads against 4 local agents per routing policy: hit rate, TTFT, load spread.",
    ),
)  # fmt: skip


def find(argv: list[str]) -> tuple[Delegate, list[str]] | None:
    """The delegate named at the start of argv and the arguments meant for it, if any."""
    for delegate in DELEGATES:
        n = len(delegate.command)
        if tuple(argv[:n]) == delegate.command:
            return delegate, argv[n:]
    return None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Placeholders so that `kvplane --help` and `kvplane bench --help` list the delegated commands.

    main() dispatches delegated commands before this parser sees them.
    """
    bench = subparsers.add_parser("bench", help="benchmarks", description="Benchmarks of kvplane's parts.")
    bench_commands = bench.add_subparsers(title="benchmarks", metavar="BENCHMARK")
    for delegate in DELEGATES:
        target = bench_commands if delegate.command[0] == "bench" else subparsers
        target.add_parser(delegate.command[-1], help=delegate.help, add_help=False)
    bench.set_defaults(func=lambda args: usage_error(bench))


def build_parser(delegate: Delegate, module: ModuleType) -> argparse.ArgumentParser:
    """The command's parser, built by its module (docs/operations.md's flag tables are rendered
    from it: flag_reference.py)."""
    parser = argparse.ArgumentParser(prog=delegate.prog, description=delegate.description)
    module.add_arguments(parser)
    if delegate.server:
        flag_sources.add_config_argument(parser)
    return parser


def run(delegate: Delegate, argv: list[str]) -> int:
    module = import_extra(delegate.module, extra=delegate.extra, what=delegate.prog)
    parser = build_parser(delegate, module)
    if delegate.server:
        try:
            flag_sources.apply(parser, argv, os.environ)
        except flag_sources.FlagSourceError as e:
            print(f"{delegate.prog}: {e}", file=sys.stderr)
            return EXIT_USAGE
    args = parser.parse_args(argv)
    with extra_needed(extra=delegate.extra, what=delegate.prog):
        return int(module.run(args) or 0)
