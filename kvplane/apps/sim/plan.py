"""`kvplane plan`: colocated or disaggregated, how many workers, and what a user should expect.

Given a model, GPU, tensor parallelism, link, latency objectives and a workload (input/output
lengths and a prefix-sharing rate, or a trace), it answers with numbers:

1. KV arithmetic (exact, kvplane.hardware): bytes per token, per request, and the transfer time
   of one request's KV over every known link;
2. one worker, unloaded (the roofline): prefill time of the mean prompt, a decode step at batch 1;
   an objective no unloaded worker meets is named before any search;
3. candidates, each simulated (kvplane.apps.sim.simulator, admission `none`, so attainment counts every
   request): colocated (N `both` workers, every prompt prefilled where it decodes) and
   disaggregated (P prefill + D decode workers, every prompt prefilled remotely and its KV moved);
   - with `--rate R`: per mode, the fewest workers (and for disaggregation the best P:D split)
     whose attainment of both objectives at R is at least `--attainment`;
   - with `--workers N` (the default, 8): per mode and split, the highest rate that still meets
     `--attainment` (a doubling search, then bisection), i.e. goodput within the objectives;
   - with `--host-gib S,S` (several sizes): instead of the search, what host memory per worker
     buys: per size, one simulation of `--workers N` colocated workers (default 8) with that host
     tier at `--rate` (default: the trace's own rate, or the closed-form estimate), its hit rate
     by tier, the oracle with the same capacity, TTFT p50/p99 and goodput within the objectives;
4. the answer: the mode needing fewer GPUs (or serving more within the objectives), its expected
   TTFT/TPOT p50/p99 and goodput, and the bottleneck: the KV transfer when it is over a third of
   the TTFT p50, KV memory when a pool filled, else the objective closer to its limit at p99
   (TTFT: prefill; TPOT: decode).
Starting points come from a closed-form capacity estimate (the roofline's prefill time and the
largest decode batch whose step meets the TPOT objective); the simulator decides.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvplane import hardware
from kvplane.apps.bench.load import BATCH_OBJECTIVE_FACTOR
from kvplane.apps.bench.workload import PRIORITY_BATCH, PRIORITY_INTERACTIVE, read_trace
from kvplane.apps.sim import report, workloads
from kvplane.apps.sim.fleet import AgentTiming
from kvplane.apps.sim.simulator import FleetSpec, SimRequest, Simulator
from kvplane.apps.sim.sweep import length_range
from kvplane.controlplane.core.planner import PlannerConfig
from kvplane.controlplane.core.policies.kvplane import KvplaneParams
from kvplane.controlplane.core.router import RouterConfig
from kvplane.controlplane.core.settings import ClusterSettings
from kvplane.dataplane.engines.sim import SimConfig
from kvplane.dataplane.engines.sim import plugin as sim_plugin
from kvplane.latency import prefill_attention
from kvplane.types import DisaggMode, Objective, Role

COLOCATED, DISAGGREGATED = "colocated", "disaggregated"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sim_plugin.add_hardware_arguments(parser.add_argument_group("hardware (the sim engine's flags)"), host_size_list=True)
    parser.add_argument("--block-size", type=int, default=SimConfig().block_size, help="tokens per KV block (default %(default)s)")
    parser.add_argument("--max-tokens-limit", type=int, default=SimConfig().max_tokens_limit, help=argparse.SUPPRESS)
    w = parser.add_argument_group("workload and objectives")
    w.add_argument("--input-tokens", default="4096", metavar="N|LO-HI", help="prompt tokens (default %(default)s)")
    w.add_argument("--output-tokens", default="256", metavar="N|LO-HI", help="output tokens (default %(default)s)")
    w.add_argument("--prefix-share", type=float, default=0.0, metavar="F", help="share of each prompt that is a shared prefix (default 0)")
    w.add_argument("--trace", default="", metavar="FILE", help="a Mooncake-format trace instead of lengths ('bundled' for the bundled one)")
    w.add_argument("--ttft-ms", type=float, default=2000.0, help="TTFT objective (default %(default)s)")
    w.add_argument("--tpot-ms", type=float, default=100.0, help="TPOT objective (default %(default)s)")
    w.add_argument("--attainment", type=float, default=0.9, help="share of requests that must meet both objectives (default %(default)s)")
    s = parser.add_argument_group("search")
    s.add_argument("--rate", type=float, default=0.0, metavar="RPS", help="target requests/s: find the fewest workers for it")
    s.add_argument(
        "--workers", type=int, default=0, metavar="N", help="worker budget: find the most requests/s within the objectives (default 8)"
    )
    s.add_argument(
        "--max-workers", type=int, default=256, metavar="N", help="--rate: give up beyond this many workers (default %(default)s)"
    )
    s.add_argument(
        "--duration", type=float, default=30.0, metavar="S", help="virtual seconds of arrivals per simulation (default %(default)s)"
    )
    s.add_argument("--seed", type=int, default=0, help="seed (default %(default)s)")
    s.add_argument("--json", action="store_true", help="print the answer as JSON")
    s.add_argument(
        "--plot", default="", metavar="FILE.png", help="write goodput against offered rate for each candidate (needs matplotlib)"
    )


@dataclass(frozen=True, slots=True)
class Candidate:
    mode: str
    num_prefill: int
    num_decode: int  # decode workers, or `both` workers when colocated

    @property
    def num_workers(self) -> int:
        return self.num_prefill + self.num_decode

    @property
    def label(self) -> str:
        if self.mode == COLOCATED:
            return f"colocated {self.num_decode} both"
        return f"disaggregated {self.num_prefill}P:{self.num_decode}D"


@dataclass(slots=True)
class Evaluation:
    candidate: Candidate
    rate: float
    row: dict[str, Any]
    ttft_misses: int
    tpot_misses: int
    transfer_s_p50: float
    kv_full: bool
    prefill_busy: float  # share of the run the prefill-doing workers spent computing prompts

    @property
    def attainment(self) -> float:
        return self.row["attainment"] or 0.0


class Planner:
    def __init__(self, args: argparse.Namespace, log: Callable[[str], None]) -> None:
        self.args = args
        self.log = log
        self.engine = sim_plugin.hardware_config_from_args(args)
        self.model = hardware.model(self.engine.model)
        self.roofline = self.engine.roofline_model()
        self.link = hardware.link(self.engine.link)
        self.objective = Objective(args.ttft_ms, args.tpot_ms)
        self.objectives = {
            PRIORITY_INTERACTIVE: self.objective,
            PRIORITY_BATCH: Objective(args.ttft_ms * BATCH_OBJECTIVE_FACTOR, args.tpot_ms * BATCH_OBJECTIVE_FACTOR),
        }
        values = {f"objectives.*.{p}.{k}": f"{getattr(o, k):g}" for p, o in self.objectives.items() for k in ("ttft_ms", "tpot_ms")}
        self.settings = ClusterSettings(values)
        if not 0 < args.attainment <= 1:
            raise ValueError(f"--attainment must be in (0, 1], got {args.attainment}")
        if args.trace:
            records = read_trace(None if args.trace == "bundled" else args.trace)
            span = (records[-1].timestamp_ms - records[0].timestamp_ms) / 1000 if len(records) > 1 else 1.0
            self.trace_rate = len(records) / max(span, 1e-9)
            self.mean_input = sum(min(r.input_length, self.model.max_context - 1) for r in records) / len(records)
            self.mean_output = sum(max(1, r.output_length) for r in records) / len(records)
            self.synthetic = None
        else:
            self.synthetic = (
                workloads.SyntheticSpec(length_range(args.input_tokens), length_range(args.output_tokens), args.prefix_share)
                .validate()
                .check_fits(self.model.key, self.model.max_context)
            )
            self.mean_input = sum(self.synthetic.input_tokens) / 2
            self.mean_output = sum(self.synthetic.output_tokens) / 2
        self.num_simulations = 0

    # -- closed-form starting points ------------------------------------------------------------
    def prefill_s(self, tokens: float) -> float:
        n, done, total, chunk = int(tokens), 0, 0.0, self.engine.max_num_batched_tokens
        while done < n:
            step = min(chunk, n - done)
            total += self.roofline.step_seconds(step, prefill_attention(step, done))
            done += step
        return total

    def decode_batch(self) -> tuple[int, float]:
        """The largest decode batch whose step meets the TPOT objective (and fits the KV pool),
        with its step seconds."""
        context = self.mean_input + self.mean_output / 2
        kv_limit = max(1, int(self.engine.total_blocks() * self.engine.block_size // (self.mean_input + self.mean_output)))
        best = (1, self.roofline.step_seconds(decode_seqs=1, decode_context_tokens=int(context)))
        for b in range(1, min(self.engine.max_num_seqs, kv_limit) + 1):
            step = self.roofline.step_seconds(decode_seqs=b, decode_context_tokens=int(b * context))
            if step * 1000 > 0.8 * self.objective.tpot_ms:
                break
            best = (b, step)
        return best

    def estimate(self, candidate: Candidate) -> float:
        """Requests/s the candidate serves by the closed form (a starting point for the search)."""
        prefill = self.prefill_s(self.mean_input * (1 - self.args.prefix_share))
        batch, step = self.decode_batch()
        decode_rate = batch / (self.mean_output * step)
        if candidate.mode == DISAGGREGATED:
            return min(candidate.num_prefill / prefill, candidate.num_decode * decode_rate)
        return candidate.num_decode / (prefill + 1 / decode_rate)

    def splits(self, num_workers: int) -> list[Candidate]:
        """Disaggregated splits around the closed-form balance of prefill and decode."""
        prefill = self.prefill_s(self.mean_input * (1 - self.args.prefix_share))
        batch, step = self.decode_batch()
        share = prefill / (prefill + self.mean_output * step / batch)  # of the workers that should prefill
        centre = min(max(round(num_workers * share), 1), num_workers - 1)
        picks = sorted({min(max(p, 1), num_workers - 1) for p in (centre - 1, centre, centre + 1)})
        return [Candidate(DISAGGREGATED, p, num_workers - p) for p in picks]

    # -- simulation -------------------------------------------------------------------------------
    def requests(self, rate: float) -> list[SimRequest]:
        a = self.args
        if self.synthetic is None:
            return workloads.trace(
                None if a.trace == "bundled" else a.trace, speed=rate / self.trace_rate, duration_s=a.duration,
                max_context=self.model.max_context, vocab_size=self.model.vocab_size,
            )  # fmt: skip
        return workloads.synthetic(self.synthetic, rate, a.duration, a.seed, self.model.vocab_size)

    def evaluate(self, candidate: Candidate, rate: float, engine: SimConfig | None = None) -> Evaluation:
        engine = engine or self.engine
        fleet = FleetSpec(engine, candidate.num_prefill, candidate.num_decode if candidate.mode == DISAGGREGATED else 0,
                          candidate.num_decode if candidate.mode == COLOCATED else 0)  # fmt: skip
        disagg = DisaggMode.ALWAYS if candidate.mode == DISAGGREGATED else DisaggMode.NEVER
        # Tier loads priced at the simulated worker's rates (its PCIe links, its drive).
        policy = KvplaneParams(
            host_load_gb_per_s=engine.host_load_bytes_per_s() / 1e9, disk_load_gb_per_s=engine.disk_load_bytes_per_s() / 1e9
        )
        config = PlannerConfig(admission_policy="none", router=RouterConfig(policy=policy, disagg_threshold_tokens=0))
        sim = Simulator(fleet, config, self.settings, seed=self.args.seed, agent=AgentTiming(), disagg=disagg)
        requests = self.requests(rate)
        result = sim.run(requests)
        self.num_simulations += 1
        window = self.args.duration if self.synthetic is not None else max(requests[-1].arrival_s if requests else 0.0, 1e-9)
        row = report.row(result, window, self.objectives)
        ttft_misses = sum(1 for r in result.records if r.ttft_s is None or r.ttft_s * 1000 > self.objective.ttft_ms)
        tpot_misses = sum(1 for r in result.records if r.tpot_s is not None and r.tpot_s * 1000 > self.objective.tpot_ms)
        transfers = sorted(r.kv_transfer_s for r in result.records if r.disaggregated)
        kv_full = any(w.peak_used_blocks >= 0.98 * w.engine.load().num_total_blocks for w in result.workers)
        span = max(result.duration_s, 1e-9)
        prefillers = [w for w in result.workers if w.role is Role.PREFILL] or result.workers
        prefill_busy = sum(w.prefill_busy_s for w in prefillers) / (len(prefillers) * span)
        transfer_p50 = transfers[len(transfers) // 2] if transfers else 0.0
        e = Evaluation(candidate, rate, row, ttft_misses, tpot_misses, transfer_p50, kv_full, prefill_busy)
        self.log(f"  {candidate.label:<28} at {rate:7.2f} req/s: attainment {e.attainment:6.1%}, TTFT p50 {row['ttft_p50_ms'] or 0:8.0f} ms, "
                 f"TPOT p50 {row['tpot_p50_ms'] or 0:6.1f} ms")  # fmt: skip
        return e

    def meets(self, e: Evaluation) -> bool:
        return e.attainment >= self.args.attainment and e.row["failed"] == 0

    def max_rate(self, candidate: Candidate) -> Evaluation | None:
        """The highest rate meeting the attainment, with its run: steps of 1.5x from the closed-form
        estimate until the answer is bracketed, then 3 bisections (within about 5 %)."""
        rate = max(self.estimate(candidate), 0.05)
        good: Evaluation | None = None
        bad_rate: float | None = None
        for _ in range(8):
            e = self.evaluate(candidate, rate)
            if self.meets(e):
                good = e
                if bad_rate is not None:
                    break
                rate *= 1.5
            else:
                bad_rate = rate
                if good is not None:
                    break
                rate /= 1.5
        if good is None or bad_rate is None:
            return good
        low, high = good.rate, bad_rate
        for _ in range(3):
            mid = (low + high) / 2
            e = self.evaluate(candidate, mid)
            if self.meets(e):
                good, low = e, mid
            else:
                high = mid
        return good

    def best_split(self, num_workers: int, rate: float | None = None) -> Evaluation:
        """The disaggregated split of num_workers doing best at `rate` (default: the closed-form
        estimate of the balanced split), each split simulated once."""
        candidates = self.splits(num_workers)
        rate = rate or self.estimate(candidates[len(candidates) // 2])
        runs = [self.evaluate(c, rate) for c in candidates]
        return max(runs, key=lambda e: (min(e.attainment, self.args.attainment), e.row["goodput_rps"]))

    def fewest_workers(self, mode: str, rate: float) -> Evaluation | None:
        """The fewest workers (and best split) meeting the attainment at `rate`."""
        unit = self.estimate(Candidate(mode, 1, 1) if mode == DISAGGREGATED else Candidate(mode, 0, 1))
        n = max(2 if mode == DISAGGREGATED else 1, math.ceil(rate / max(unit, 1e-9) * (2 if mode == DISAGGREGATED else 1)))
        found: Evaluation | None = None
        while n <= self.args.max_workers:
            best = self._best_at(mode, n, rate)
            if self.meets(best):
                found = best
                n -= 1
                if n < (2 if mode == DISAGGREGATED else 1):
                    break
                continue
            if found is not None:
                break
            n = max(n + 1, math.ceil(n * 1.25))
        return found

    def _best_at(self, mode: str, n: int, rate: float) -> Evaluation:
        if mode == DISAGGREGATED:
            return self.best_split(n, rate)
        return self.evaluate(Candidate(COLOCATED, 0, n), rate)

    # -- the answer -------------------------------------------------------------------------------
    def kv(self) -> dict[str, Any]:
        per_token = self.model.kv_bytes_per_token
        per_request = int(round(self.mean_input)) * per_token
        return {
            "bytes_per_token": per_token,
            "prompt_tokens": int(round(self.mean_input)),
            "bytes_per_request": per_request,
            "transfer_ms": {name: round(hardware.link(name).transfer_seconds(per_request) * 1000, 1) for name in hardware.names("links")},
        }

    def bottleneck(self, e: Evaluation) -> str:
        """What limits the candidate: the link when the transfer is over a third of the TTFT p50,
        KV memory when a pool filled, else the objective closer to its limit at p99 (TTFT: the
        prefill side; TPOT: the decode side)."""
        r = e.row
        ttft_p50 = (r["ttft_p50_ms"] or 0) / 1000
        if e.candidate.mode == DISAGGREGATED and ttft_p50 > 0 and e.transfer_s_p50 > ttft_p50 / 3:
            return f"the KV transfer over {self.link.key} ({e.transfer_s_p50 * 1000:.0f} ms of a {ttft_p50 * 1000:.0f} ms TTFT p50)"
        ttft = (r["ttft_p99_ms"] or 0) / self.objective.ttft_ms
        tpot = (r["tpot_p99_ms"] or 0) / self.objective.tpot_ms
        detail = f"TTFT p99 at {ttft:.0%} of its objective, TPOT p99 at {tpot:.0%}; prefill busy {e.prefill_busy:.0%} of the time"
        if e.kv_full:
            return f"KV memory: a worker's pool filled ({detail})"
        if ttft >= tpot:
            where = "the prefill workers" if e.candidate.mode == DISAGGREGATED else "prefill, and its interference with decode"
        else:
            where = "decode memory bandwidth" if e.candidate.mode == DISAGGREGATED else "decode steps slowed by prefill chunks"
        return f"{where} ({detail})"

    def describe(self, e: Evaluation) -> dict[str, Any]:
        r = e.row
        c = e.candidate
        return {
            "mode": c.mode, "prefill_workers": c.num_prefill, "decode_workers": c.num_decode if c.mode == DISAGGREGATED else 0,
            "both_workers": c.num_decode if c.mode == COLOCATED else 0, "workers": c.num_workers, "gpus": c.num_workers * self.engine.tp,
            "rate_rps": round(e.rate, 3), "goodput_rps": r["goodput_rps"], "attainment": r["attainment"],
            "goodput_per_gpu": round(r["goodput_rps"] / (c.num_workers * self.engine.tp), 4),
            "ttft_p50_ms": r["ttft_p50_ms"], "ttft_p99_ms": r["ttft_p99_ms"], "tpot_p50_ms": r["tpot_p50_ms"], "tpot_p99_ms": r["tpot_p99_ms"],
            "kv_transfer_p50_ms": round(e.transfer_s_p50 * 1000, 1), "ttft_misses": e.ttft_misses, "tpot_misses": e.tpot_misses,
            "bottleneck": self.bottleneck(e),
        }  # fmt: skip


def plan(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    p = Planner(args, log)
    e = p.engine
    unloaded_prefill = p.prefill_s(p.mean_input)
    unloaded_decode = p.roofline.step_seconds(decode_seqs=1, decode_context_tokens=int(p.mean_input))
    out: dict[str, Any] = {
        "hardware": {"model": p.model.key, "gpu": hardware.gpu(e.gpu).key, "tp": e.tp, "link": p.link.key, "kv_blocks_per_worker": e.total_blocks()},
        "workload": {"mean_input_tokens": round(p.mean_input, 1), "mean_output_tokens": round(p.mean_output, 1),
                     "prefix_share": args.prefix_share, "trace": args.trace or None},
        "objectives_ms": {"ttft": args.ttft_ms, "tpot": args.tpot_ms, "attainment": args.attainment},
        "kv": p.kv(),
        "unloaded": {"prefill_ms": round(unloaded_prefill * 1000, 1), "decode_step_ms": round(unloaded_decode * 1000, 2)},
    }  # fmt: skip
    problems = []
    if unloaded_prefill * 1000 > args.ttft_ms:
        problems.append(
            f"prefilling a {p.mean_input:.0f}-token prompt takes {unloaded_prefill * 1000:.0f} ms on an idle worker, over the TTFT objective"
        )
    if unloaded_decode * 1000 > args.tpot_ms:
        problems.append(f"one decode step takes {unloaded_decode * 1000:.1f} ms on an idle worker, over the TPOT objective")
    if problems:
        out["infeasible"] = problems
        return out
    sizes = args.sim_host_gib if isinstance(args.sim_host_gib, list) else [args.sim_host_gib]
    if len(sizes) > 1:
        out["host_tiers"] = host_tiers(p, sizes, log)
        out["num_simulations"] = p.num_simulations
        return out
    candidates: dict[str, Evaluation | None] = {}
    if args.rate > 0:
        out["search"] = {"target_rate_rps": args.rate}
        for mode in (COLOCATED, DISAGGREGATED):
            log(f"{mode}: fewest workers for {args.rate:g} requests/s ...")
            candidates[mode] = p.fewest_workers(mode, args.rate)
    else:
        n = args.workers or 8
        out["search"] = {"workers": n}
        log(f"colocated: the most requests/s {n} workers serve within the objectives ...")
        candidates[COLOCATED] = p.max_rate(Candidate(COLOCATED, 0, n))
        if n >= 2:
            log(f"disaggregated: the best P:D split of {n} workers, then the most requests/s it serves ...")
            candidates[DISAGGREGATED] = p.max_rate(p.best_split(n).candidate)
    out["candidates"] = {mode: p.describe(ev) for mode, ev in candidates.items() if ev is not None}
    found = list(out["candidates"].values())
    if not found:
        out["answer"] = None
    elif args.rate > 0:
        best = min(found, key=lambda c: (c["gpus"], -c["goodput_rps"]))
        out["answer"] = best["mode"]
    else:
        best = max(found, key=lambda c: c["goodput_rps"])
        out["answer"] = best["mode"]
    out["num_simulations"] = p.num_simulations
    if args.plot and candidates:
        out["curves"] = curves(p, [ev for ev in candidates.values() if ev is not None], log)
    return out


def host_tiers(p: Planner, sizes: list[float], log: Callable[[str], None]) -> dict[str, Any]:
    """Per host size: one colocated run at the same rate, and what it gave (module docstring)."""
    n = p.args.workers or 8
    candidate = Candidate(COLOCATED, 0, n)
    rate = p.args.rate or (p.trace_rate if p.synthetic is None else p.estimate(candidate))
    log(f"host tiers: {n} colocated workers at {rate:.2f} requests/s, host GiB per worker {', '.join(f'{s:g}' for s in sizes)} ...")
    rows = []
    for size in sizes:
        e = p.evaluate(candidate, rate, dataclasses.replace(p.engine, host_gib=size).validate())
        r = e.row
        rows.append({
            "host_gib": size, "hit_rate": r["hit_rate"], "hit_device": r["hit_device"], "hit_host": r["hit_host"],
            "hit_disk": r["hit_disk"], "oracle_hit_rate": r["oracle_hit_rate"], "infinite_hit_rate": r["infinite_hit_rate"],
            "ttft_p50_ms": r["ttft_p50_ms"], "ttft_p99_ms": r["ttft_p99_ms"], "tpot_p99_ms": r["tpot_p99_ms"],
            "goodput_rps": r["goodput_rps"], "attainment": r["attainment"],
        })  # fmt: skip
    return {"workers": n, "rate_rps": round(rate, 4), "disk_gib": p.engine.disk_gib, "rows": rows}


def format_host_tiers(h: dict[str, Any]) -> list[str]:
    header = ("host GiB", "hit", "device", "host", "disk", "oracle", "infinite", "TTFT p50", "TTFT p99", "goodput/s", "attain")
    lines = [
        f"host memory per worker: {h['workers']} colocated workers at {h['rate_rps']:.2f} requests/s"
        + (f", disk {h['disk_gib']:g} GiB each" if h["disk_gib"] else ""),
        " | ".join(header),
        " | ".join("---" for _ in header),
    ]
    for r in h["rows"]:
        lines.append(" | ".join((
            f"{r['host_gib']:g}", f"{r['hit_rate']:.3f}", f"{r['hit_device']:.3f}", f"{r['hit_host']:.3f}", f"{r['hit_disk']:.3f}",
            f"{r['oracle_hit_rate']:.3f}", f"{r['infinite_hit_rate']:.3f}", f"{r['ttft_p50_ms'] or 0:.0f}", f"{r['ttft_p99_ms'] or 0:.0f}",
            f"{r['goodput_rps']:.2f}", f"{(r['attainment'] or 0):.1%}",
        )))  # fmt: skip
    return lines


def curves(p: Planner, evaluations: list[Evaluation], log: Callable[[str], None]) -> dict[str, list[tuple[float, float]]]:
    """Goodput against offered rate for each candidate (0.25x to 2x its answer rate)."""
    out = {}
    for ev in evaluations:
        log(f"curve of {ev.candidate.label} ...")
        points = [
            (round(ev.rate * f, 3), p.evaluate(ev.candidate, ev.rate * f).row["goodput_rps"]) for f in (0.25, 0.5, 0.75, 1, 1.25, 1.5, 2)
        ]
        out[ev.candidate.label] = points
    return out


def write_plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, points in result.get("curves", {}).items():
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
    lim = max((x for pts in result.get("curves", {}).values() for x, _ in pts), default=1)
    ax.plot([0, lim], [0, lim], color="grey", linestyle=":", linewidth=1, label="every request in objectives")
    h = result["hardware"]
    ax.set_title(f"kvplane plan: {h['model']} on {h['tp']} x {h['gpu']} per worker, KV over {h['link']}")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("goodput (requests/s within TTFT and TPOT)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_text(result: dict[str, Any]) -> str:
    h, w, o, kv, u = result["hardware"], result["workload"], result["objectives_ms"], result["kv"], result["unloaded"]
    lines = [
        f"{h['model']} on {h['tp']} x {h['gpu']} per worker, KV over {h['link']} ({h['kv_blocks_per_worker']:,} KV blocks per worker)",
        f"workload: {w['mean_input_tokens']:g} input / {w['mean_output_tokens']:g} output tokens on average"
        + (f", prefix share {w['prefix_share']:g}" if w["prefix_share"] else "") + (f", trace {w['trace']}" if w["trace"] else ""),
        f"objectives: TTFT {o['ttft']:g} ms, TPOT {o['tpot']:g} ms, for {o['attainment']:.0%} of requests",
        "",
        f"KV cache: {kv['bytes_per_token']:,} B per token; {kv['bytes_per_request'] / 1e9:.2f} GB for a {kv['prompt_tokens']:,}-token prompt",
        "transfer of one prompt's KV: " + ", ".join(f"{k} {v:.0f} ms" for k, v in kv["transfer_ms"].items()),
        f"one idle worker: prefill {u['prefill_ms']:.0f} ms, decode step {u['decode_step_ms']:.1f} ms",
    ]  # fmt: skip
    if "infeasible" in result:
        lines += ["", "no configuration meets the objectives:", *(f"  - {p}" for p in result["infeasible"])]
        return "\n".join(lines)
    if "host_tiers" in result:
        return "\n".join([*lines, "", *format_host_tiers(result["host_tiers"])])
    cands = result["candidates"]
    lines.append("")
    if not cands:
        lines.append("no candidate met the objectives within the search limits (raise --max-workers or relax the objectives)")
        return "\n".join(lines)
    header = (
        "mode",
        "workers",
        "GPUs",
        "rate/s",
        "goodput/s",
        "attain",
        "goodput/GPU",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "KV xfer p50",
    )
    lines += [" | ".join(header), " | ".join("---" for _ in header)]
    for c in cands.values():
        workers = f"{c['prefill_workers']}P:{c['decode_workers']}D" if c["mode"] == DISAGGREGATED else f"{c['both_workers']} both"
        lines.append(" | ".join((
            c["mode"], workers, str(c["gpus"]), f"{c['rate_rps']:.2f}", f"{c['goodput_rps']:.2f}", f"{(c['attainment'] or 0):.1%}",
            f"{c['goodput_per_gpu']:.3f}", f"{c['ttft_p50_ms']:.0f}", f"{c['ttft_p99_ms']:.0f}", f"{c['tpot_p50_ms']:.1f}",
            f"{c['tpot_p99_ms']:.1f}", f"{c['kv_transfer_p50_ms']:.0f}",
        )))  # fmt: skip
    best = cands[result["answer"]]
    other = [c for m, c in cands.items() if m != result["answer"]]
    lines.append("")
    verdict = f"answer: {best['mode']}, {best['workers']} workers ({best['gpus']} GPUs)"
    if "target_rate_rps" in result["search"]:
        verdict += f" for {result['search']['target_rate_rps']:g} requests/s"
        if other:
            verdict += f"; {other[0]['mode']} needs {other[0]['gpus']} GPUs"
    else:
        verdict += f" serve {best['goodput_rps']:.2f} requests/s within the objectives"
        if other and other[0]["goodput_rps"]:
            verdict += f", {best['goodput_rps'] / other[0]['goodput_rps']:.2f}x {other[0]['mode']}'s {other[0]['goodput_rps']:.2f}"
    lines += [verdict, f"bottleneck: {best['bottleneck']}"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.monotonic()
    try:
        result = plan(args, log)
    except ValueError as e:
        print(f"kvplane plan: {e}", file=sys.stderr)
        return 2
    log(f"done in {time.monotonic() - started:.0f} s ({result.get('num_simulations', 0)} simulations)")
    if args.plot:
        write_plot(result, args.plot)
        log(f"plot written to {args.plot}")
    if args.json:
        print(json.dumps(result))
    else:
        print(format_text(result))
    return 0
