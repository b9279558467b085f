"""`kvplane sim --grid`: the decision grid, every routing policy on every cell, kvplane judged
against the peers (issue 22).

Cell groups (each a `kvplane sim` sweep with the command's other flags: hardware, seed, ...):
- trace-both / trace-pd: the bundled Mooncake trace at speed 1, 2 and 4, on 16 `both` workers /
  on 8 prefill + 8 decode;
- chat, agent, rag: `kvplane bench prefix`'s workloads at speed 1, 8 and 32 on 8 `both`;
- synthetic: 1,024-4,096-token prompts, 64-256 output tokens (the admission benchmark's mix,
  docs/benchmarks.md) for 20 virtual seconds, at 1, 1.5 and 2 times the capacity a closed loop
  measures first, on 8 `both`.
Every routing policy runs every cell with admission `none` (the peers have no admission of this
kind, so routing is compared alone; `--compare-admission` changes it); the synthetic group adds
kvplane with `predictive` admission, whose attainment at 2x is a target.

Targets, judged per cell for each kvplane row against the peers (dynamo, sglang, llm-d) with
admission `none`: TTFT p99 <= 1.02 x the best peer's; goodput within the objectives >= 0.98 x
the best peer's; at the group's lowest load, hit rate >= 0.95 x the oracle's (one pooled LRU
cache, simulator.OracleCache); at 2x load with admission, attainment >= 95 % of the admitted.
`--requests N` keeps each level's first N requests (a quick, smaller grid); `--grid-groups`
and `--compare-routing` pick a subset. Progress goes to stderr, the tables to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvplane.apps.sim.sweep import Level, Sweep, level_row
from kvplane.controlplane.core.policies import PEER_POLICIES, routing_policy_names

JUDGED = "kvplane"
TTFT_SLACK = 1.02  # kvplane's TTFT p99 may be this much above the best peer's
GOODPUT_SLACK = 0.98  # its goodput this much below the best peer's
HIT_SHARE = 0.95  # of the oracle's hit rate, at a group's lowest load
ATTAINMENT = 0.95  # of the admitted, at 2x load with admission


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    title: str
    flags: dict[str, Any]  # `kvplane sim` arguments this group sets
    extra: tuple[tuple[str, str], ...] = ()  # (routing, admission) runs beyond every policy with the base admission
    default_duration_s: float = 0.0


_FLEETS = {"both16": {"both": 16, "prefill": 0, "decode": 0}, "pd": {"both": 0, "prefill": 8, "decode": 8},
           "both8": {"both": 8, "prefill": 0, "decode": 0}}  # fmt: skip
GROUPS = (
    Group("trace-both", "Mooncake trace, 16 both workers", {"workload": "trace", "speed": [1.0, 2.0, 4.0], **_FLEETS["both16"]}),
    Group("trace-pd", "Mooncake trace, 8 prefill + 8 decode", {"workload": "trace", "speed": [1.0, 2.0, 4.0], **_FLEETS["pd"]}),
    *(Group(w, f"{w}, 8 both workers", {"workload": w, "speed": [1.0, 8.0, 32.0], **_FLEETS["both8"]}) for w in ("chat", "agent", "rag")),
    Group(
        "synthetic",
        "synthetic 1024-4096 in / 64-256 out, load factors 1, 1.5, 2, 8 both workers",
        {
            "workload": "synthetic",
            "load_factors": [1.0, 1.5, 2.0],
            "rate": None,
            "input_tokens": "1024-4096",
            "output_tokens": "64-256",
            **_FLEETS["both8"],
        },
        extra=((JUDGED, "predictive"),),
        default_duration_s=20.0,
    ),  # fmt: skip
)
GROUP_NAMES = tuple(g.name for g in GROUPS)


@dataclass(slots=True)
class Verdict:
    level: str
    row: str  # routing/admission of the judged row
    target: str
    value: float | None
    reference: float | None  # the best peer's value, or the bound
    reference_of: str  # whose (a peer's routing), or "bound"
    met: bool | None  # None: cannot be judged (no peer ran, no oracle hits)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class GroupResult:
    group: Group
    config: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)


def _group_args(args: argparse.Namespace, group: Group, routings: list[str]) -> argparse.Namespace:
    values = dict(vars(args))
    values.update(group.flags)
    values["duration"] = args.duration or group.default_duration_s
    values["compare_routing"] = routings
    values["compare_processes"] = False
    return argparse.Namespace(**values)


def _truncated(level: Level, limit: int) -> Level:
    """The level's first `limit` requests (the trace is cut when it is read: Sweep.levels)."""
    if not limit or len(level.requests) <= limit:
        return level
    kept = level.requests[:limit]
    return dataclasses.replace(level, requests=kept, window_s=max(max(r.arrival_s for r in kept), 1e-9))


def run_grid(args: argparse.Namespace, log: Callable[[str], None]) -> list[GroupResult]:
    routings = args.compare_routing or list(routing_policy_names())
    admissions = args.compare_admission or ["none"]
    names = args.grid_groups or list(GROUP_NAMES)
    groups = [g for g in GROUPS if g.name in names]
    started = time.monotonic()
    out = []
    for gi, group in enumerate(groups, 1):
        log(f"[grid {gi}/{len(groups)}] {group.name}: {group.title} ...")
        sweep = Sweep(_group_args(args, group, routings), log)
        levels, capacity = sweep.levels()
        levels = [_truncated(level, args.requests) for level in levels]
        pairs = [(r, a) for r in routings for a in admissions]
        pairs += [pair for pair in group.extra if pair not in pairs and pair[0] in routings]
        result = GroupResult(group, sweep.config(capacity))
        runs = len(levels) * len(pairs)
        for li, level in enumerate(levels):
            for pi, (routing, admission) in enumerate(pairs):
                n = li * len(pairs) + pi + 1
                log(f"[grid {gi}/{len(groups)} {group.name} run {n}/{runs}] {level.label} {routing}/{admission}: "
                    f"{len(level.requests)} requests on {sweep.fleet.num_workers} workers (wall {time.monotonic() - started:.0f} s so far)")  # fmt: skip
                result.rows.append(level_row(sweep, level, routing, admission))
        result.verdicts = judge(result.rows, [level.label for level in levels], admissions[0])
        out.append(result)
    return out


def judge(rows: list[dict[str, Any]], level_labels: list[str], peer_admission: str) -> list[Verdict]:
    """Each kvplane row of each level against the best peer row (admission `peer_admission`) of
    that level, and against the fixed bounds (module docstring)."""
    verdicts = []
    for li, label in enumerate(level_labels):
        here = [r for r in rows if r["level"] == label]
        peers = [r for r in here if r["routing"] in PEER_POLICIES and r["admission"] == peer_admission]
        for r in (r for r in here if r["routing"] == JUDGED):
            name = f"{r['routing']}/{r['admission']}"
            ttft = [p for p in peers if p["ttft_p99_ms"] is not None]
            if ttft and r["ttft_p99_ms"] is not None:
                best = min(ttft, key=lambda p: p["ttft_p99_ms"])
                met = r["ttft_p99_ms"] <= best["ttft_p99_ms"] * TTFT_SLACK
                verdicts.append(
                    Verdict(label, name, "TTFT p99 <= 1.02x best peer", r["ttft_p99_ms"], best["ttft_p99_ms"], best["routing"], met)
                )
            else:
                verdicts.append(Verdict(label, name, "TTFT p99 <= 1.02x best peer", r["ttft_p99_ms"], None, "no peer", None))
            if peers:
                best = max(peers, key=lambda p: p["goodput_rps"])
                met = r["goodput_rps"] >= best["goodput_rps"] * GOODPUT_SLACK
                verdicts.append(
                    Verdict(label, name, "goodput >= 0.98x best peer", r["goodput_rps"], best["goodput_rps"], best["routing"], met)
                )
            else:
                verdicts.append(Verdict(label, name, "goodput >= 0.98x best peer", r["goodput_rps"], None, "no peer", None))
            if li == 0:
                oracle = r["oracle_hit_rate"]
                share = r["hit_rate"] / oracle if oracle else None
                verdicts.append(
                    Verdict(label, name, "hit >= 0.95x oracle", share, HIT_SHARE, "bound", None if share is None else share >= HIT_SHARE)
                )
            if r.get("load_factor") == 2.0 and r["admission"] != "none":
                verdicts.append(
                    Verdict(label, name, "attainment >= 95% at 2x", r["attainment"], ATTAINMENT, "bound", r["attainment"] >= ATTAINMENT)
                )
    return verdicts


# -- output --------------------------------------------------------------------------------------

_COLUMNS = (("level", "load", "{}"), ("policy", "routing/admission", "{}"), ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
            ("ttft_p99_ms", "TTFT p99 ms", "{:.0f}"), ("goodput_rps", "goodput/s", "{:.2f}"), ("attainment", "attain", "{:.1%}"),
            ("rejected", "rejected", "{}"), ("hit_rate", "hit", "{:.3f}"), ("oracle_hit_rate", "oracle", "{:.3f}"),
            ("hit_vs_oracle", "hit/oracle", "{:.2f}"))  # fmt: skip


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def format_group(result: GroupResult) -> str:
    lines = [f"### {result.group.name}: {result.group.title}"]
    c = result.config
    lines.append(
        f"{c['model']} on {c['tp']} x {c['gpu']} per worker, {c['prefill']} prefill / {c['decode']} decode / {c['both']} both"
        + (f"; capacity {c['capacity_rps']:.2f} requests/s" if c.get("capacity_rps") else "")
    )
    lines.append("")
    lines.append("| " + " | ".join(h for _, h, _ in _COLUMNS) + " |")
    lines.append("|" + "|".join("---" for _ in _COLUMNS) + "|")
    for r in result.rows:
        values = dict(r, policy=f"{r['routing']}/{r['admission']}")
        values["hit_vs_oracle"] = r["hit_rate"] / r["oracle_hit_rate"] if r["oracle_hit_rate"] else None
        lines.append("| " + " | ".join(_cell(values.get(k), f) for k, _, f in _COLUMNS) + " |")
    lines.append("")
    lines.append("| load | kvplane row | target | kvplane | best peer / bound | verdict |")
    lines.append("|---|---|---|---:|---:|---|")
    for v in result.verdicts:
        value = _cell(v.value, "{:.3g}")
        reference = _cell(v.reference, "{:.3g}") + ("" if v.reference_of == "bound" else f" ({v.reference_of})")
        verdict = "n/a" if v.met is None else "met" if v.met else "**missed**"
        lines.append(f"| {v.level} | {v.row} | {v.target} | {value} | {reference} | {verdict} |")
    return "\n".join(lines)


def summary(results: list[GroupResult]) -> tuple[int, int]:
    """(targets met, targets judged) over the whole grid."""
    judged = [v for r in results for v in r.verdicts if v.met is not None]
    return sum(v.met for v in judged), len(judged)


def write_plot(results: list[GroupResult], path: str) -> None:
    """Per group, TTFT p99 and goodput per load level and policy (kvplane's rows drawn thick),
    the misses marked: the grid's tables as one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(12, 3.2 * len(results)), squeeze=False)
    for (ttft_ax, goodput_ax), result in zip(axes, results, strict=True):
        levels = list(dict.fromkeys(r["level"] for r in result.rows))
        for policy in dict.fromkeys(f"{r['routing']}/{r['admission']}" for r in result.rows):
            rows = {r["level"]: r for r in result.rows if f"{r['routing']}/{r['admission']}" == policy}
            style = {"linewidth": 2.8, "zorder": 3} if policy.startswith(f"{JUDGED}/") else {"linewidth": 1.2, "alpha": 0.8}
            x = [i for i, level in enumerate(levels) if level in rows]
            ttft_ax.plot(x, [rows[levels[i]]["ttft_p99_ms"] or float("nan") for i in x], marker="o", label=policy, **style)
            goodput_ax.plot(x, [rows[levels[i]]["goodput_rps"] for i in x], marker="o", label=policy, **style)
        for v in result.verdicts:
            if v.met is False:
                ax = ttft_ax if v.target.startswith("TTFT") else goodput_ax if v.target.startswith("goodput") else None
                if ax is not None:
                    ax.plot(levels.index(v.level), v.value, marker="x", color="red", markersize=12, zorder=4)
        for ax, label in ((ttft_ax, "TTFT p99 (ms)"), (goodput_ax, "goodput (requests/s within objectives)")):
            ax.set_xticks(range(len(levels)), levels)
            ax.set_ylabel(label)
            ax.set_title(f"{result.group.name}: {label.split(' (')[0]}", fontsize=10)
            ax.grid(alpha=0.3)
        ttft_ax.set_yscale("log")
        goodput_ax.legend(fontsize=7, loc="best")
    met, judged = summary(results)
    fig.suptitle(f"kvplane sim --grid: kvplane (thick) against the peers and baselines; {met} of {judged} targets met (x: missed)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    started = time.monotonic()
    try:
        results = run_grid(args, log)
    except ValueError as e:
        print(f"kvplane sim --grid: {e}", file=sys.stderr)
        return 2
    log(f"grid done in {time.monotonic() - started:.0f} s")
    if args.plot:
        write_plot(results, args.plot)
        log(f"plot written to {args.plot}")
    met, judged = summary(results)
    if args.json:
        groups = [{"name": r.group.name, "title": r.group.title, "config": r.config, "rows": r.rows,
                   "verdicts": [v.as_dict() for v in r.verdicts]} for r in results]  # fmt: skip
        print(json.dumps({"groups": groups, "targets_met": met, "targets_judged": judged}))
        return 0
    for r in results:
        print(format_group(r))
        print()
    print(f"kvplane met {met} of {judged} targets judged" + (f" (--requests {args.requests} per level)" if args.requests else ""))
    return 0
