"""`kvplane bench controlplane`: the highest request rate 1, 2 and 4 control-plane replicas
sustain in front of a simulated fleet, and where their CPU goes.

Setup, per replica count: a fresh etcd, a LocalCluster of that many replicas on it
(`--admission none` and `--rate-limit 0`, so that nothing is rejected: every refusal would count
as an error) and `--workers` sim agents, `--workers / --hosts` of them per process (`kvplane
agent --count`; sim engines sleep through their steps, `--speedup` simulated seconds per wall
second, and report load every `--load-report-interval` seconds, which the replicas take as fresh
for three times that, `--stale-report-s`), plus `--generators` load
generator processes (kvplane/apps/bench/openloop.py), generator g sending to replica g mod R. Security
is what `kvplane up` runs: mutual TLS with throw-away certificates (`--insecure`: plaintext with
tokens). After a warm-up (every agent dialled once) the replicas' idle CPU is measured: load
reports, keep-alives, the store's watch (`background_cores`; of it the event loop, the main
thread's, apart from gRPC's C threads); on a NATS bus once the store has
taken no write for 3 s (at most 90 s: a warm-up that overloads the replicas lets leases lapse, and
workers registering again are not idle work; `settled_s` says how long that took).

With `--buses store,nats` every replica count runs once per bus (controlplane/bus/): `store`
carries load reports and KV events as etcd keys, `nats` through a nats-server with JetStream
started beside etcd, `nats-agents` the same with the agents publishing their load reports and KV
batches on it themselves (`kvplane controlplane --bus-for-agents`). The idle measurement also gives etcd's key writes per second (its
etcd_mvcc_put_total + etcd_mvcc_delete_total), NATS's messages in per second (its /varz in_msgs:
publishes, acks and flow control) and the replicas' CPU per worker per second of reports.
`--idle-only` stops there (no rate search).

Then per request shape (short: 128 tokens in / 32 out; long: 4,096 / 256; token ids, or with
`--text` as many ASCII letters, one token each for the sim workers' byte tokenizer) and mode (`relay`:
Kvplane.Generate streamed through the control plane; `lookaside`: Route places the request, the
generator streams from the decode agent and reports first token and end), a rate search (kvplane/apps/bench/ratesearch.py):
steps of `--duration-s` at an offered Poisson rate, doubled while sustained, then bisected.
Sustained = no error, completions keep up with arrivals (>= 95 %) and the replicas' routing p99
(route + admit, the kvplane_routing_duration_seconds histogram) under 5 ms.

Reported for the highest sustained step: its rate, routing p50/p99, the replicas' CPU per
completed request (/proc/PID/stat over the step; `net` leaves out the idle background), the
shares of that CPU spent routing, admitting, relaying and taking lookaside reports
(kvplane_controlplane_cpu_seconds_total)
and the rest (gRPC, asyncio, validation, tickets, registry and store work), plus the CPU the
agents (also per request, less their idle background) and generators used. Everything shares this machine's cores: the rates are partly a
measure of contention, the CPU per request is the portable number.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

from kvplane.apps.bench.cores import pin, split_cores
from kvplane.apps.bench.openloop import MODES, SHAPES
from kvplane.apps.bench.ratesearch import (
    Limits,
    RateSearch,
    delta,
    histogram_quantile,
    label_values,
    phase_shares,
    sample_key,
    step_verdict,
    summed,
    window_ratio,
)
from kvplane.stats import percentile

AGENTS_PER_HOST = 64
DEFAULT_START_RPS = {"short": 16.0, "long": 8.0}
PHASES = ("route", "admit", "relay", "report")
CPU_METRIC = "kvplane_controlplane_cpu_seconds_total"
ROUTING_BUCKETS = "kvplane_routing_duration_seconds_bucket"
SETTLE_S = 1.0
_PACKAGE_ROOT = Path(__file__).resolve().parents[3]


def _csv(kind: type, choices: tuple[str, ...] = ()):
    def parse(text: str) -> list:
        values = [kind(v.strip()) for v in text.split(",") if v.strip()]
        if not values:
            raise argparse.ArgumentTypeError("expected one or more comma-separated values")
        unknown = [v for v in values if choices and v not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {list(choices)}")
        if kind is int and any(v < 1 for v in values):
            raise argparse.ArgumentTypeError("counts must be at least 1")
        return values

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=_csv(int), default=[1, 2, 4], metavar="N,N,...",
                        help="control-plane replica counts, each on one etcd (default 1,2,4)")  # fmt: skip
    parser.add_argument("--modes", type=_csv(str, tuple(MODES)), default=["relay", "lookaside"], metavar="M,...",
                        help="request modes: relay, lookaside (reports on one stream, as the asyncio SDK), "
                             "lookaside-calls (a Report call each, as the blocking SDK) (default relay,lookaside)")  # fmt: skip
    parser.add_argument("--shapes", type=_csv(str, tuple(SHAPES)), default=list(SHAPES), metavar="S,...",
                        help="request shapes: short (128 in / 32 out), long (4,096 in / 256 out) (default both)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=128, help="simulated workers (default %(default)s)")
    parser.add_argument("--hosts", type=int, default=0, metavar="N",
                        help=f"processes the workers run in (default: one per {AGENTS_PER_HOST})")  # fmt: skip
    parser.add_argument("--generators", type=int, default=0, metavar="N",
                        help="load generator processes (default: the replica count, at least 2)")  # fmt: skip
    parser.add_argument("--duration-s", type=float, default=6.0, metavar="S", help="arrivals per step, seconds (default %(default)s)")
    parser.add_argument("--grace-s", type=float, default=10.0, metavar="S",
                        help="after a step's arrivals, how long its last requests may take before they count as errors (default %(default)s)")  # fmt: skip
    parser.add_argument("--start-rps", type=float, default=0.0, metavar="R",
                        help="first offered rate of each search (default: 16 short, 8 long)")  # fmt: skip
    parser.add_argument("--resolution", type=float, default=0.15, metavar="F",
                        help="stop bisecting when failed / sustained rate <= 1 + F (default %(default)s)")  # fmt: skip
    parser.add_argument("--max-steps", type=int, default=9, metavar="N", help="steps per search at most (default %(default)s)")
    parser.add_argument("--min-ratio", type=float, default=Limits().min_ratio, metavar="F",
                        help="sustained: completions / arrivals in the steady window at least F (default %(default)s)")  # fmt: skip
    parser.add_argument("--max-routing-p99-ms", type=float, default=Limits().max_routing_p99_ms, metavar="MS",
                        help="sustained: the replicas' route + admit p99 below this (default %(default)s)")  # fmt: skip
    parser.add_argument("--speedup", type=float, default=4.0,
                        help="sim agents' simulated seconds per wall second (default %(default)s)")  # fmt: skip
    parser.add_argument("--load-report-interval", type=float, default=1.0, metavar="S",
                        help="agents' load report interval (the agent default 0.2 s costs 128 workers ~0.4 core on each side); "
                        "the replicas take reports as fresh for 3x this (--stale-report-s) (default %(default)s)")  # fmt: skip
    parser.add_argument("--sim-num-blocks", type=int, default=8192, metavar="N", help="KV blocks per sim worker (default %(default)s)")
    parser.add_argument("--buses", type=_csv(str, ("store", "nats", "nats-agents")), default=["store", "nats"], metavar="B,...",
                        help="how load reports and KV events reach the replicas, each measured in turn: store, nats, nats-agents "
                        "(NATS, the agents publishing their load reports and KV batches there themselves) (default store,nats)")  # fmt: skip
    parser.add_argument("--stream-interval", type=int, default=0, metavar="N",
                        help="tokens per streamed message after the first that the generators ask for (GenerateRequest."
                        "stream_interval; 0: every token) (default %(default)s)")  # fmt: skip
    parser.add_argument("--text", action="store_true",
                        help="send text prompts of the shape's length (the control plane tokenizes them with the sim "
                        "workers' byte tokenizer, and detokenizes relayed answers) instead of token ids")  # fmt: skip
    parser.add_argument("--idle-only", action="store_true", help="measure the replicas' idle CPU, store writes and bus messages only")
    parser.add_argument("--lease-ttl", type=int, default=0, metavar="S",
                        help="the agents' lease TTL (keep-alives every third of it; default: the control plane's, 10 s)")  # fmt: skip
    parser.add_argument("--idle-s", type=float, default=3.0, metavar="S",
                        help="how long the idle measurement lasts (default %(default)s; keep-alives come every 3.3 s, "
                        "snapshots every 10 s)")  # fmt: skip
    parser.add_argument("--insecure", action="store_true", help="plaintext gRPC with tokens instead of mutual TLS")
    parser.add_argument("--pin", action="store_true",
                        help="each replica alone on a core of its own, everything else on the cores left (needs replicas + 1 "
                        "cores; Linux): replicas compared without sharing a core")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="", metavar="DIR", help="keep the servers' logs here (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


# ---------------------------------------------------------------------------------------------
# Processes: CPU, metrics, generators.


def process_cpu_s(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds of a process (and its threads) so far; of one thread, given its id
    (a Python process's main thread, its event loop, has the process's id)."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores, all processes: /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        sample_key(s.name, s.labels): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(("kvplane_controlplane_cpu", "kvplane_routing_duration"))
    }


class Generators:
    """The load generator processes, one JSON step at a time (kvplane/apps/bench/openloop.py)."""

    def __init__(self, endpoints: list[str], log_dir: Path, timeout_s: float) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH")]))
        self._logs: list[IO[bytes]] = []
        self.processes: list[subprocess.Popen[str]] = []
        for i, endpoint in enumerate(endpoints):
            log = (log_dir / f"generator-{i}.log").open("ab")
            self._logs.append(log)
            argv = [sys.executable, "-m", "kvplane.apps.bench.openloop", "--endpoint", endpoint, "--timeout", str(timeout_s)]
            self.processes.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env))
        for i in range(len(self.processes)):
            self._read(i)  # {"ready": true}

    def _read(self, i: int) -> dict[str, Any]:
        line = self.processes[i].stdout.readline()
        if not line:
            raise RuntimeError(f"load generator {i} exited (code {self.processes[i].poll()}); see generator-{i}.log")
        return json.loads(line)

    def step(self, commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for process, command in zip(self.processes, commands, strict=True):
            process.stdin.write(json.dumps(command) + "\n")
            process.stdin.flush()
        return [self._read(i) for i in range(len(self.processes))]

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.stdin.close()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self._logs:
            log.close()


# ---------------------------------------------------------------------------------------------
# One replica count: cluster, warm-up, background, searches.


class Bench:
    def __init__(self, args: argparse.Namespace, cluster, generators: Generators, log, etcd, nats=None) -> None:
        self.args = args
        self.cluster = cluster
        self.etcd, self.nats = etcd, nats
        self.generators = generators
        self.log = log
        self.replicas = list(cluster.controlplane_endpoints)
        self.hosts = [name for name in cluster.processes if name in cluster.hosted_workers]
        self.metrics_urls = []
        for endpoint in cluster.controlplane_endpoints.values():
            with cluster.client(endpoint) as client:
                url = client.stats().metrics_url
            if not url:
                raise RuntimeError(f"the replica at {endpoint} serves no metrics endpoint")
            self.metrics_urls.append(url)
        self.limits = Limits(args.min_ratio, args.max_routing_p99_ms).validate()
        self.background_cores = 0.0
        self.hosts_background_cores = 0.0  # the agents' (load reports, KV snapshots)
        self._seed = args.seed

    def _cpu(self, names: list[str]) -> float:
        return sum(process_cpu_s(self.cluster.processes[name].pid) for name in names)

    def _loop_cpu(self) -> float:
        pids = [self.cluster.processes[name].pid for name in self.replicas]
        return sum(process_cpu_s(pid, thread=pid) for pid in pids)

    def measure_background(self, seconds: float = 3.0) -> dict[str, float]:
        """The replicas' CPU with no request running (reports, keep-alives, the store's watch, the
        bus), and the store writes and bus messages per second meanwhile."""
        counts = self.counters()
        before, hosts_before, started = self._cpu(self.replicas), self._cpu(self.hosts), time.monotonic()
        loop_before = self._loop_cpu()
        time.sleep(seconds)
        elapsed = time.monotonic() - started
        loop_cores = (self._loop_cpu() - loop_before) / elapsed
        self.background_cores = (self._cpu(self.replicas) - before) / elapsed
        self.hosts_background_cores = (self._cpu(self.hosts) - hosts_before) / elapsed
        after = self.counters()
        per_s = {name: (after[name] - counts[name]) / elapsed for name in counts}
        num_workers = sum(len(w) for w in self.cluster.hosted_workers.values()) or len(self.cluster.worker_endpoints)
        return {
            "replica_cores": round(self.background_cores / len(self.replicas), 4),
            # Of it the event loop (the main thread); the rest is mostly gRPC's C threads.
            "replica_loop_cores": round(loop_cores / len(self.replicas), 4),
            "replica_ms_per_worker_s": round(1e3 * self.background_cores / len(self.replicas) / max(num_workers, 1), 4),
            "store_writes_per_s": round(per_s["store_writes"], 1), "bus_messages_per_s": round(per_s["bus_messages"], 1),
        }  # fmt: skip

    def settle(self, quiet_s: float = 3.0, max_s: float = 90.0) -> tuple[float, float]:
        """Waits until the store has taken no write for `quiet_s`, for at most `max_s`: a warm-up
        that overloaded the replicas lets leases lapse, and the workers registering again would
        be measured as idle work. Returns the seconds waited and the store's writes per second
        over the last `quiet_s` (0 once settled)."""
        started = time.monotonic()
        samples = [(started, self.counters()["store_writes"])]  # (when, writes so far)
        quiet_since = started
        while True:
            time.sleep(0.5)
            now, writes = time.monotonic(), self.counters()["store_writes"]
            if writes != samples[-1][1]:
                quiet_since = now
            samples.append((now, writes))
            if now - quiet_since >= quiet_s:
                return now - started, 0.0
            if now - started >= max_s:
                then, before = next((t, w) for t, w in samples if t >= now - quiet_s)
                return now - started, (writes - before) / max(now - then, 0.5)

    def counters(self) -> dict[str, float]:
        etcd = _read_metrics(f"http://{self.etcd.endpoint}/metrics", ("etcd_mvcc_put_total", "etcd_mvcc_delete_total"))
        bus = 0.0
        if self.nats is not None:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.nats.monitor_port}/varz", timeout=5) as response:
                bus = float(json.loads(response.read())["in_msgs"])
        return {"store_writes": sum(etcd.values()), "bus_messages": bus}

    def step(self, shape: str, mode: str, rate_rps: float, duration_s: float | None = None) -> dict[str, Any]:
        """One step at `rate_rps` offered in all; its measurements (the module docstring)."""
        duration_s = duration_s or self.args.duration_s
        num = len(self.generators.processes)
        self._seed += 1
        commands = [
            {"shape": shape, "mode": mode, "rate_rps": rate_rps / num, "duration_s": duration_s,
             "grace_s": self.args.grace_s, "seed": self._seed * 1000 + i, "stream_interval": self.args.stream_interval,
             "text": self.args.text}
            for i in range(num)
        ]  # fmt: skip
        metrics_before = [scrape(url) for url in self.metrics_urls]
        cp_before, hosts_before, machine_before = self._cpu(self.replicas), self._cpu(self.hosts), machine_busy_s()
        started = time.monotonic()
        results = self.generators.step(commands)
        wall = time.monotonic() - started
        cp_cpu, hosts_cpu = self._cpu(self.replicas) - cp_before, self._cpu(self.hosts) - hosts_before
        machine_cpu = machine_busy_s() - machine_before
        counters = summed(delta(b, scrape(url)) for b, url in zip(metrics_before, self.metrics_urls, strict=True))
        time.sleep(SETTLE_S)  # load reports of the drained workers catch up

        sent = sum(r["sent"] for r in results)
        ok = sum(r["ok"] for r in results)
        errors: dict[str, int] = {}
        for r in results:
            for code, n in r["errors"].items():
                errors[code] = errors.get(code, 0) + n
        # The generators' steps start within milliseconds of each other: pooled, as one arrival process.
        ratio = window_ratio(*([t for r in results for t in r[key]] for key in ("arrivals_s", "completions_s", "latencies_s")), duration_s)
        buckets = {float(le): n for le, n in label_values(counters, ROUTING_BUCKETS, "le").items()}
        p50, p99 = histogram_quantile(0.50, buckets), histogram_quantile(0.99, buckets)
        phase_cpu = {p: label_values(counters, CPU_METRIC, "kvplane_phase").get(p, 0.0) for p in PHASES}
        sustained, why = step_verdict(sum(errors.values()), ratio, None if p99 is None else p99 * 1000, self.limits)
        kept_up, _ = step_verdict(sum(errors.values()), ratio, None, self.limits)
        generator_cores = max((r["cpu_s"] / r["wall_s"] for r in results if r["sent"] and r["wall_s"] > 0), default=0.0)
        ttfts = [t for r in results for t in r["ttfts_s"]]
        return {
            "offered_rps": round(rate_rps, 2),
            "sent": sent,
            "ok": ok,
            "errors": errors,
            "window_ratio": round(ratio, 3),
            "sustained": sustained,  # every criterion, routing p99 included
            "kept_up": kept_up,  # no error and completions kept up (routing p99 aside)
            "why_not": why,
            "routing_p50_ms": None if p50 is None else round(p50 * 1000, 3),
            "routing_p99_ms": None if p99 is None else round(p99 * 1000, 3),
            "cp_cpu_ms_per_request": round(cp_cpu / ok * 1000, 3) if ok else None,
            "cp_cpu_ms_per_request_net": round(max(0.0, cp_cpu - self.background_cores * wall) / ok * 1000, 3) if ok else None,
            "cp_cores": round(cp_cpu / wall, 3),
            "phase_shares": {k: round(v, 4) for k, v in phase_shares(phase_cpu, cp_cpu).items()},
            "agents_cores": round(hosts_cpu / wall, 3),
            "agents_cpu_ms_per_request_net": round(max(0.0, hosts_cpu - self.hosts_background_cores * wall) / ok * 1000, 3) if ok else None,
            "generator_cores_max": round(generator_cores, 3),
            "machine_busy_cores": round(machine_cpu / wall, 3),
            "ttft_p50_ms": None if not ttfts else round(percentile(ttfts, 50) * 1000, 2),
            "ttft_p99_ms": None if not ttfts else round(percentile(ttfts, 99) * 1000, 2),
            "wall_s": round(wall, 2),
        }

    def search(self, shape: str, mode: str) -> dict[str, Any]:
        args = self.args
        search = RateSearch(args.start_rps or DEFAULT_START_RPS[shape], args.resolution, args.max_steps)
        steps = []
        while (rate := search.next_rate()) is not None:
            step = self.step(shape, mode, rate)
            steps.append(step)
            search.record(rate, step["kept_up"])
            verdict = "sustained" if step["sustained"] else f"kept up, but {step['why_not']}" if step["kept_up"] else step["why_not"]
            self.log(
                f"  [{len(self.replicas)} x {mode} {shape}] {rate:7.1f} req/s: {step['ok']}/{step['sent']} ok, "
                f"window {step['window_ratio']:.2f}, routing p99 {step['routing_p99_ms']} ms, CP {step['cp_cores']:.2f} cores, "
                f"agents {step['agents_cores']:.2f}, generator {step['generator_cores_max']:.2f}, machine {step['machine_busy_cores']:.2f} -> {verdict}"
            )
        sustained = max((s for s in steps if s["sustained"]), key=lambda s: s["offered_rps"], default=None)
        kept_up = max((s for s in steps if s["kept_up"]), key=lambda s: s["offered_rps"], default=None)
        return {
            "replicas": len(self.replicas), "mode": mode, "shape": shape,
            "sustained_rps": sustained["offered_rps"] if sustained else 0.0,  # every criterion, among the rates tried
            "kept_up_rps": kept_up["offered_rps"] if kept_up else 0.0,  # the search's answer: throughput, no errors
            "at_kept_up": kept_up, "first_failed": min((s for s in steps if not s["kept_up"]), key=lambda s: s["offered_rps"], default=None),
            "background_cores": round(self.background_cores, 3), "steps": steps,
        }  # fmt: skip


def _read_metrics(url: str, names: tuple[str, ...]) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name in names}


def run_replicas(args: argparse.Namespace, num_replicas: int, bus: str, log_dir: Path, log) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of one replica count on one bus, and its idle measurement."""
    from kvplane.apps.cluster import LocalCluster
    from kvplane.apps.local_etcd import start_etcd
    from kvplane.apps.local_nats import start_nats

    hosts = args.hosts or max(1, math.ceil(args.workers / AGENTS_PER_HOST))
    per_host = math.ceil(args.workers / hosts)
    etcd = start_etcd(log_dir / f"etcd-{num_replicas}-{bus}")
    nats = start_nats(log_dir / f"nats-{num_replicas}-{bus}") if bus.startswith("nats") else None
    tag = f"[{num_replicas} replica(s), bus {bus}]"
    try:
        log(f"{tag} starting: etcd at {etcd.endpoint}, {hosts} x {per_host} sim agents, "
            f"{'plaintext + tokens' if args.insecure else 'mutual TLS'} ...")  # fmt: skip
        started = time.monotonic()
        cluster = LocalCluster(
            num_prefill=0, num_decode=0, num_both=hosts, agents_per_process=per_host, store=etcd.url,
            num_controlplanes=num_replicas, insecure=args.insecure, log_dir=log_dir / f"cluster-{num_replicas}-{bus}",
            startup_timeout=180.0, bus=nats.url if nats else "store",
            agent_args=("--engine", "sim", "--speedup", repr(args.speedup), "--sim-num-blocks", str(args.sim_num_blocks),
                        "--load-report-interval", repr(args.load_report_interval), "--lease-ttl", str(args.lease_ttl),
                        "--metrics-port", "-1", "--log-level", "WARNING"),
            controlplane_args=("--admission", "none", "--rate-limit", "0", "--log-level", "WARNING",
                               "--stale-report-s", repr(max(1.0, 3 * args.load_report_interval)),
                               *(("--bus-for-agents", nats.url) if bus == "nats-agents" else ())),
        )  # fmt: skip
        with cluster:
            log(f"{tag} {hosts * per_host} workers registered in {time.monotonic() - started:.0f} s")
            replicas = list(cluster.controlplane_endpoints.values())
            num_generators = args.generators or max(2, num_replicas)
            generators = Generators([replicas[g % num_replicas] for g in range(num_generators)], log_dir, args.grace_s + 60)
            try:
                if args.pin:
                    _pin(cluster, generators, etcd, nats, split_cores(num_replicas, args.cores), tag, log)
                bench = Bench(args, cluster, generators, log, etcd, nats)
                # Lookaside callers dial the agents: each generator opens its pool first.
                if any(m.startswith("lookaside") for m in args.modes):
                    with cluster.client(timeout=30) as admin:
                        agents = [w.endpoint for w in admin.workers()]
                    pools = generators.step([{"connect": agents}] * num_generators)
                    log(f"{tag} generators connected to {min(p['connected'] for p in pools)}/{len(agents)} agents")
                # Warm-up: about two requests per worker, so every replica has dialled the agents.
                warm = bench.step("short", args.modes[0], max(8.0, 2 * hosts * per_host / 4), 4.0)
                log(f"{tag} warm-up: {warm['ok']}/{warm['sent']} ok")
                time.sleep(2 * args.load_report_interval)  # the warm-up's last reports and KV events land first
                settled_s = 0.0
                if bus != "store":  # (on the store bus every report is a store write)
                    settled_s, still_writing = bench.settle()
                    if still_writing:
                        log(f"{tag} the store still takes {still_writing:.0f} writes/s {settled_s:.0f} s after the warm-up "
                            "(workers registering again): the idle numbers include that")  # fmt: skip
                    else:
                        log(f"{tag} no store write for 3 s ({settled_s:.0f} s after the warm-up)")
                idle = {"replicas": num_replicas, "bus": bus, "workers": hosts * per_host, "settled_s": round(settled_s, 1),
                        **bench.measure_background(args.idle_s)}  # fmt: skip
                log(f"{tag} idle: {idle['replica_cores']:.3f} cores per replica ({idle['replica_loop_cores']:.3f} its event loop), "
                    f"{idle['store_writes_per_s']:.0f} store writes/s, "
                    f"{idle['bus_messages_per_s']:.0f} NATS messages in/s")  # fmt: skip
                rows = [] if args.idle_only else [bench.search(shape, mode) for shape in args.shapes for mode in args.modes]
                for row in rows:
                    row["bus"] = bus
                return rows, idle
            finally:
                generators.close()
    finally:
        etcd.stop()
        if nats is not None:
            nats.stop()


def _pin(cluster, generators: Generators, etcd, nats, cores: tuple[list[set[int]], set[int]], tag: str, log) -> None:
    """--pin: each replica on its own core, every other process of the bench on the rest."""
    own, rest = cores
    names = list(cluster.controlplane_endpoints)
    for name, cores in zip(names, own, strict=True):
        pin(cluster.processes[name].pid, cores)
    others = [p.pid for name, p in cluster.processes.items() if name not in names] + [p.pid for p in generators.processes]
    for pid in [os.getpid(), etcd.process.pid, *([nats.process.pid] if nats else []), *others]:
        pin(pid, rest)
    log(f"{tag} pinned: replicas on cores {', '.join(str(min(c)) for c in own)}, the rest on {sorted(rest)}")


# ---------------------------------------------------------------------------------------------
# Output and command.


def format_table(result: dict[str, Any]) -> str:
    headers = ("replicas", "bus", "mode", "shape", "req/s", "req/s, p99 < limit", "route p50 ms", "route p99 ms", "CP CPU ms/req", "net",
               *PHASES, "other", "CP cores", "agents", "agent CPU ms/req", "gen")  # fmt: skip
    lines = [" | ".join(headers), " | ".join("---" for _ in headers)]

    def num(value: Any, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    for row in result["rows"]:
        s = row["at_kept_up"] or {}
        shares = s.get("phase_shares", {})
        lines.append(" | ".join((
            str(row["replicas"]), row.get("bus", "store"), row["mode"], row["shape"], num(row["kept_up_rps"], 1), num(row["sustained_rps"], 1), num(s.get("routing_p50_ms")),
            num(s.get("routing_p99_ms")), num(s.get("cp_cpu_ms_per_request")), num(s.get("cp_cpu_ms_per_request_net")),
            *(f"{shares[p] * 100:.0f}%" if p in shares else "-" for p in (*PHASES, "other")),
            num(s.get("cp_cores")), num(s.get("agents_cores")), num(s.get("agents_cpu_ms_per_request_net")),
            num(s.get("generator_cores_max")),
        )))  # fmt: skip
    return "\n".join(f"| {line} |" for line in lines)


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    for name in ("workers", "max_steps"):
        if getattr(args, name) < 1:
            log(f"kvplane bench controlplane: --{name.replace('_', '-')} must be at least 1")
            return 2
    if min(args.duration_s, args.grace_s, args.speedup, args.load_report_interval) <= 0 or args.hosts < 0 or args.generators < 0:
        log("kvplane bench controlplane: --duration-s, --grace-s, --speedup and --load-report-interval must be positive")
        return 2
    if args.pin:
        args.cores = os.sched_getaffinity(0)  # before the bench pins itself to the rest
        try:
            split_cores(max(args.replicas), args.cores)
        except ValueError as e:
            log(f"kvplane bench controlplane: {e}")
            return 2
    # A SIGTERM unwinds like Ctrl-C, so the etcd, replicas, agents and generators are stopped too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvplane-bench-cp-") as tmp:
        log_dir = Path(args.log_dir) if args.log_dir else Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        rows, idle = [], []
        for bus in args.buses:
            for num_replicas in args.replicas:
                more, quiet = run_replicas(args, num_replicas, bus, log_dir, log)
                rows += more
                idle.append(quiet)
    hosts = args.hosts or max(1, math.ceil(args.workers / AGENTS_PER_HOST))
    result = {
        "config": {
            "workers": hosts * math.ceil(args.workers / hosts), "hosts": hosts, "generators": args.generators or "max(2, replicas)",
            "security": "plaintext + tokens" if args.insecure else "mutual TLS", "admission": "none", "rate_limit": "off",
            "speedup": args.speedup, "load_report_interval_s": args.load_report_interval, "duration_s": args.duration_s,
            "min_ratio": args.min_ratio, "max_routing_p99_ms": args.max_routing_p99_ms, "cpu_count": os.cpu_count(),
            "stream_interval": args.stream_interval, "prompts": "text" if args.text else "token ids",
        },
        "rows": rows,
        "idle": idle,
        "elapsed_s": round(time.monotonic() - started, 1),
    }  # fmt: skip
    log(f"done in {result['elapsed_s']:.0f} s")
    if args.json:
        print(json.dumps(result))
        return 0
    c = result["config"]
    print(f"{c['workers']} sim workers in {c['hosts']} processes, {c['security']}, admission none, {c['prompts']} prompts, "
          f"{c['cpu_count']} cores shared by everything; highest sustained rate per row:")  # fmt: skip
    if rows:
        print(format_table(result))
    print(
        "req/s = the highest rate served with no error and completions keeping up (the search's answer; the other columns "
        "are measured there); req/s, p99 < limit = the highest rate tried that also kept routing p99 under "
        f"{args.max_routing_p99_ms:g} ms"
    )
    print("CP CPU = the replicas' CPU per completed request (net: without their idle background); route/admit/relay/report/other = "
          "shares of it; CP cores, agents, gen = cores used by the replicas, the agent processes and the busiest generator; "
          "agent CPU = the agent processes' CPU per completed request, without their idle background")  # fmt: skip
    print()
    print(format_idle(result, args.load_report_interval, args.lease_ttl))
    return 0


def format_idle(result: dict[str, Any], report_interval_s: float, lease_ttl_s: int = 0) -> str:
    lease = f", lease TTL {lease_ttl_s} s" if lease_ttl_s else ""
    lines = [
        f"idle (every worker reporting every {report_interval_s:g} s{lease}, no request):",
        "| replicas | bus | workers | cores per replica | of it event loop | ms per worker-second | store writes/s | NATS messages in/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for q in result["idle"]:
        lines.append(f"| {q['replicas']} | {q['bus']} | {q['workers']} | {q['replica_cores']:.3f} | {q['replica_loop_cores']:.3f} | "
                     f"{q['replica_ms_per_worker_s']:.3f} | "
                     f"{q['store_writes_per_s']:.0f} | {q['bus_messages_per_s']:.0f} |")  # fmt: skip
    return "\n".join(lines)
