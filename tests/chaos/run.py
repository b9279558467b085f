"""The chaos suite (`make chaos`): a seeded, bounded, randomized fault schedule against a local
etcd-backed cluster under greedy traffic, with the invariants checked after every step.

    python -m tests.chaos.run --seed 7 --steps 16

Cluster: a three-member etcd and a nats-server on loopback, two control-plane replicas, one prefill and two decode
agents (KV over the gRPC stream, `--fault-injection`), supervised as `kvplane up` supervises
(kvplane/apps/supervisor.py). Secure by default, as `kvplane up` runs: mutual TLS on every hop with
the LocalCluster's throw-away certificates (both replicas present the control plane's, restarted
children get theirs again), tickets on every agent call; the traffic and the checks call as the
cluster's local admin. Traffic: client threads sending greedy requests (random prompt of a
fixed set, random max_tokens and disaggregation, a 20 s deadline) through both replicas; every
completed output is compared with a clean run before the faults. Faults (tests/chaos/schedule.py):
SIGKILL and SIGSTOP+SIGCONT of agents and replicas, etcd member stop/start, dropped KV event
batches, a KV transfer cut mid-way, bursts of client cancellations, and with the NATS bus (the
default; `--bus store` for the store, `--bus nats-agents` with the agents publishing their load
reports on it) nats-server SIGKILLed and restarted, and a replica that misses the bus's messages
for a while.

After each step the fault heals, then:
- the cluster serves again (a probe request succeeds) within lease TTL + 5 s of the heal;
- traffic pauses, and once every process is back: no agent holds pinned or used blocks or has a
  request running or queued, the registry lists exactly the live agents, and each worker's
  device blocks in the index equal what the worker holds;
- throughout: no output differs from the clean run, and no request outlives its deadline (+2 s).
It prints a table (faults injected, requests sent, completed, failed with a clean error, migrated,
wrong, leaked) and exits 1 when any invariant broke.
"""

from __future__ import annotations

import argparse
import collections
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from kvplane import Client, grpc_util
from kvplane.apps.cluster import LocalCluster
from kvplane.apps.supervisor import RestartPolicy, Supervisor
from kvplane.errors import KvplaneError
from kvplane.security.credentials import Credentials
from kvplane.v1 import agent_pb2, agent_pb2_grpc
from tests.chaos.schedule import Fault, make_schedule
from tests.conftest import start_etcd_cluster, start_nats

LEASE_TTL_S = 4
DEADLINE_S = 20.0
HANG_GRACE_S = 2.0  # a request may end this long after its deadline (the deadline error itself travels)
MAX_TOKENS = 120
CONTROLPLANE_ARGS = (
    "--lease-ttl", str(LEASE_TTL_S), "--token-timeout", "2", "--first-token-timeout", "15",
    "--silent-after-s", "2", "--stalled-for-s", "8", "--disagg-threshold", "32", "--max-migrations", "3",
    "--fault-injection",
)  # fmt: skip
AGENT_ARGS = ("--fault-injection", "--transports", "grpc", "--num-blocks", "256")
CHECK_TIMEOUT_S = 30.0  # how long an invariant may take to hold once traffic stops
LEAD_IN_S = 1.5  # traffic before each fault
BUSY = "busy-decode"  # a fault target resolved when it strikes: the decode worker running the most requests


@dataclass
class Tally:
    """Everything the traffic saw, thread-safe."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0
    completed: int = 0
    cancelled: int = 0  # callers that gave up on purpose
    failed: collections.Counter = field(default_factory=collections.Counter)  # clean errors by status code
    failure_samples: dict[str, list[str]] = field(default_factory=dict)  # a few messages per status code
    migrated: int = 0
    served_by: collections.Counter = field(default_factory=collections.Counter)  # decode worker of each completed request
    wrong: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


class Traffic:
    """Client threads sending greedy requests until stopped; pause() waits until none is in flight."""

    def __init__(
        self, endpoint: str, credentials: Credentials, prompts: list[list[int]], reference: list[tuple[int, ...]], tally: Tally, seed: int
    ) -> None:
        self.endpoint, self.credentials, self.prompts, self.reference, self.tally = endpoint, credentials, prompts, reference, tally
        self._rng = random.Random(seed)
        self._go = threading.Event()
        self._stop = False
        self._busy = [False] * 4
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(self._busy))]

    def start(self) -> None:
        self._go.set()
        for t in self._threads:
            t.start()

    def pause(self) -> None:
        self._go.clear()
        deadline = time.monotonic() + DEADLINE_S + HANG_GRACE_S + 5
        while any(self._busy) and time.monotonic() < deadline:
            time.sleep(0.05)

    def resume(self) -> None:
        self._go.set()

    def stop(self) -> None:
        self._stop = True
        self._go.set()
        for t in self._threads:
            t.join(DEADLINE_S + 10)

    def _run(self, index: int) -> None:
        rng = random.Random(self._rng.random())
        with Client(self.endpoint, credentials=self.credentials, timeout=DEADLINE_S) as client:
            while not self._stop:
                self._go.wait()
                if self._stop:
                    return
                self._busy[index] = True
                try:
                    self.one(client, rng)
                finally:
                    self._busy[index] = False

    def one(self, client: Client, rng: random.Random) -> None:
        k = rng.randrange(len(self.prompts))
        max_tokens = rng.randint(16, MAX_TOKENS)
        disagg = rng.choice(["auto", "auto", "always", "never"])
        self.tally.add(sent=1)
        started = time.monotonic()
        try:
            result = client.generate(self.prompts[k], max_tokens=max_tokens, ignore_eos=True, disagg=disagg)
        except KvplaneError as e:
            with self.tally.lock:
                self.tally.failed.update([e.code.name])
                samples = self.tally.failure_samples.setdefault(e.code.name, [])
                if len(samples) < 3:
                    samples.append(str(e)[:300])
            self._check_time(started, f"prompt {k} ({e.code.name})")
            time.sleep(0.2)  # as a real caller would, rather than hammering a cluster in trouble
            return
        self._check_time(started, f"prompt {k}")
        self.tally.add(completed=1, migrated=int(result.metrics.num_migrations > 0))
        self.tally.served_by.update([result.metrics.decode_worker])
        if result.token_ids != self.reference[k][:max_tokens]:
            with self.tally.lock:
                self.tally.wrong.append(f"prompt {k} max_tokens {max_tokens} via {result.metrics.decode_worker}")

    def cancel_burst(self, num: int, rng: random.Random) -> None:
        """Callers that give up: half stop reading mid-stream, half have short deadlines."""
        for i in range(num):
            k = rng.randrange(len(self.prompts))
            self.tally.add(sent=1, cancelled=1)
            if i % 2:
                with Client(self.endpoint, credentials=self.credentials, timeout=DEADLINE_S) as client:
                    stream = client.stream(self.prompts[k], max_tokens=MAX_TOKENS, ignore_eos=True, disagg=rng.choice(["auto", "always"]))
                    try:
                        for n, _ in enumerate(stream):
                            if n >= rng.randint(1, 4):
                                break
                    except KvplaneError:
                        pass
                    finally:
                        stream.close()  # cancels the call
            else:
                with Client(self.endpoint, credentials=self.credentials, timeout=rng.uniform(0.05, 0.4)) as client:
                    try:
                        client.generate(self.prompts[k], max_tokens=MAX_TOKENS, ignore_eos=True, disagg="always")
                    except KvplaneError:
                        pass

    def _check_time(self, started: float, what: str) -> None:
        elapsed = time.monotonic() - started
        if elapsed > DEADLINE_S + HANG_GRACE_S:
            with self.tally.lock:
                self.tally.hung.append(f"{what} took {elapsed:.1f} s")


class Chaos:
    def __init__(self, seed: int, num_steps: int, log_dir: Path, bus: str = "nats") -> None:
        self.seed, self.num_steps, self.log_dir, self.bus = seed, num_steps, log_dir, bus
        self.nats = None
        self.tally = Tally()
        self.violations: list[str] = []
        self.rows: list[tuple] = []
        self.recoveries: list[float] = []
        self._supervising = True

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> int:
        started = time.monotonic()
        self.etcd = start_etcd_cluster(self.log_dir / "etcd")
        if self.bus.startswith("nats"):
            self.nats = start_nats(self.log_dir / "nats")
        # nats-agents: the agents publish their load reports and KV batches on NATS themselves (--bus-for-agents).
        on_bus = ("--bus-for-agents", self.nats.url) if self.bus == "nats-agents" else ()
        self.cluster = LocalCluster(
            num_prefill=1, num_decode=2, store=self.etcd.url, num_controlplanes=2, log_dir=self.log_dir,
            agent_args=AGENT_ARGS, controlplane_args=(*CONTROLPLANE_ARGS, *on_bus), startup_timeout=180,
            bus=self.nats.url if self.nats else "store",
        )  # fmt: skip
        try:
            self.cluster.start()
            self.supervisor = Supervisor(self.cluster, RestartPolicy(initial_backoff_s=0.5, max_backoff_s=4.0, max_failures=8))
            supervising = threading.Thread(target=self._supervise, daemon=True)
            supervising.start()
            prompts, reference = self._reference()
            traffic = Traffic(self.cluster.endpoint, self.cluster.credentials.admin, prompts, reference, self.tally, self.seed)
            self.traffic = traffic
            targets = {
                # BUSY: the decode worker running the most requests when the fault strikes, so that
                # kills and stops hit streams mid-way.
                "agent": [BUSY, BUSY, *self.cluster.worker_endpoints],
                "replica": list(self.cluster.controlplane_endpoints),
                "etcd": [m.name for m in self.etcd.members],
                "prefill": ["prefill-0"],
                "bus": ["nats"] if self.nats else [],
            }
            schedule = make_schedule(self.seed, self.num_steps, targets)
            print(f"chaos: seed {self.seed}, {len(schedule)} steps; logs in {self.log_dir}", flush=True)
            traffic.start()
            for fault in schedule:
                self._step(fault)
            traffic.stop()
        finally:
            self._supervising = False
            self.cluster.stop()
            self.etcd.stop()
            if self.nats:
                self.nats.stop()
        self._print_table(schedule, time.monotonic() - started)
        return 1 if self.violations or self.tally.wrong or self.tally.hung else 0

    def _supervise(self) -> None:
        while self._supervising:
            try:
                for line in self.supervisor.step(time.monotonic()):
                    print(f"  supervisor: {line}", flush=True)
            except Exception as e:  # noqa: BLE001 - a supervisor failure is a finding, not a crash of the suite
                self.violations.append(f"supervisor: {e}")
                return
            time.sleep(0.2)

    def _reference(self) -> tuple[list[list[int]], list[tuple[int, ...]]]:
        """Prompts (half share a prefix) and their greedy outputs on the clean cluster."""
        rng = random.Random(self.seed)
        shared = [rng.randrange(256) for _ in range(48)]
        prompts = [(shared if i % 2 else []) + [rng.randrange(256) for _ in range(rng.randint(24, 80))] for i in range(8)]
        with self.cluster.client(timeout=120) as client:
            reference = [client.generate(p, max_tokens=MAX_TOKENS, ignore_eos=True, disagg="never").token_ids for p in prompts]
        return prompts, reference

    def _step(self, fault: Fault) -> None:
        before = (self.tally.sent, self.tally.completed, sum(self.tally.failed.values()), self.tally.migrated)
        began = time.monotonic()
        time.sleep(LEAD_IN_S)  # traffic flows again before the fault strikes: it hits streams mid-way
        self._inject(fault)
        recovery = self._probe()
        self.recoveries.append(recovery)
        if recovery > LEASE_TTL_S + 5:
            self.violations.append(f"step {fault.step} ({fault}): served again only after {recovery:.1f} s")
        self.traffic.pause()
        leaked = self._check()
        after = (self.tally.sent, self.tally.completed, sum(self.tally.failed.values()), self.tally.migrated)
        delta = [a - b for a, b in zip(after, before)]
        self.rows.append((fault.step, str(fault), *delta, f"{recovery:.1f}", leaked, f"{time.monotonic() - began:.0f}"))
        print(f"  step {fault.step}: {fault}: sent {delta[0]}, completed {delta[1]}, failed {delta[2]}, migrated {delta[3]}, "
              f"served again after {recovery:.1f} s, leaked {leaked}", flush=True)  # fmt: skip
        self.traffic.resume()

    # -- faults ------------------------------------------------------------------------------------

    def _busiest_decode_worker(self) -> str:
        loads = {w: _agent_load(self.cluster, w) for w in self.cluster.worker_endpoints if w.startswith("decode")}
        return max(sorted(loads), key=lambda w: loads[w].num_running if loads[w] is not None else -1)

    def _inject(self, fault: Fault) -> None:
        """Applies the fault, lets it last `duration_s` under traffic, and heals it."""
        kind, target = fault.kind, fault.target
        if target == BUSY:
            target = self._busiest_decode_worker()
            print(f"  step {fault.step}: {kind} hits {target}", flush=True)
        if kind in ("kill_agent", "kill_replica"):
            self.cluster.kill(target, signal.SIGKILL)
            time.sleep(fault.duration_s)  # the supervisor restarts it meanwhile
        elif kind in ("stop_agent", "stop_replica"):
            self.cluster.kill(target, signal.SIGSTOP)
            time.sleep(fault.duration_s)
            self.cluster.kill(target, signal.SIGCONT)
        elif kind == "stop_etcd_member":
            member = next(m for m in self.etcd.members if m.name == target)
            member.stop()
            time.sleep(fault.duration_s)
            member.restart()
        elif kind == "kill_bus":
            self.nats.kill()
            time.sleep(fault.duration_s)
            self.nats.restart()
        elif kind == "drop_bus_messages":
            self.cluster.kill(target, signal.SIGUSR1)
            time.sleep(fault.duration_s)
        elif kind == "drop_kv_batch":
            self.cluster.kill(target, signal.SIGUSR1)
            time.sleep(fault.duration_s)
        elif kind == "cut_transfer":
            self.cluster.kill(target, signal.SIGUSR2)
            time.sleep(fault.duration_s)
        elif kind == "client_cancel":
            end = time.monotonic() + fault.duration_s
            rng = random.Random(fault.step)
            while time.monotonic() < end:
                self.traffic.cancel_burst(4, rng)
        else:
            raise ValueError(f"unknown fault {kind!r}")

    def _probe(self) -> float:
        """Seconds from the heal until a request succeeds (bounded by lease TTL + 5 s, plus slack to measure)."""
        started = time.monotonic()
        with self.cluster.client(timeout=5) as client:
            while time.monotonic() - started < LEASE_TTL_S + 15:
                try:
                    client.generate([1, 2, 3, 4, 5, 6, 7, 8], max_tokens=2)
                    return time.monotonic() - started
                except KvplaneError:
                    time.sleep(0.1)
        return time.monotonic() - started

    # -- invariants -----------------------------------------------------------------------------------

    def _check(self) -> int:
        """Once traffic stopped and everything is back: nothing leaked, registry and index agree with
        the workers. Returns the number of leaked blocks and entries found (0 when clean)."""
        cluster = self.cluster
        self._wait("every process running and every agent registered", self._all_up)
        leaked = {}

        def clean() -> bool:
            leaked.clear()
            for worker_id in cluster.worker_endpoints:
                load = _agent_load(cluster, worker_id)
                if load is None:
                    return False
                held = load.num_pinned_blocks + load.num_used_blocks + load.num_running + load.num_waiting
                if held:
                    leaked[worker_id] = held
            return not leaked

        if not self._wait("no pinned or used blocks and no queued request on any agent", clean, fatal=False):
            self.violations.append(f"leaked after traffic stopped: {leaked}")
        with cluster.client(timeout=5) as client:
            live = set(cluster.worker_endpoints)
            self._wait("the registry to list exactly the live agents", lambda: {w.worker_id for w in client.workers()} == live)

            def index_converged() -> bool:
                indexed = {c.worker_id: c.blocks_by_tier.get("device", 0) for c in client.cache()}
                return all(indexed.get(w) == (_agent_load(cluster, w) or _NO_LOAD).num_cached_blocks for w in cluster.worker_endpoints)

            self._wait("the cache index to converge to what each worker holds", index_converged)
        return sum(leaked.values())

    def _all_up(self) -> bool:
        if self.cluster.exited() or any(m.process.poll() is not None for m in self.etcd.members):
            return False
        if self.nats and self.nats.process.poll() is not None:
            return False
        try:
            with self.cluster.client(timeout=2) as client:
                return {w.worker_id for w in client.workers() if w.load_age_s < 1.5} == set(self.cluster.worker_endpoints)
        except KvplaneError:
            return False

    def _wait(self, what: str, predicate, fatal: bool = True) -> bool:
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return True
            except (KvplaneError, grpc.RpcError):
                pass
            time.sleep(0.2)
        if fatal:
            self.violations.append(f"timed out after {CHECK_TIMEOUT_S:g} s waiting for {what}")
        return False

    # -- the report -------------------------------------------------------------------------------------

    def _print_table(self, schedule: list[Fault], seconds: float) -> None:
        t = self.tally
        kinds = collections.Counter(f.kind for f in schedule)
        print()
        print("step  fault                                   sent  done  failed  migrated  served-again-s  leaked  step-s")
        for row in self.rows:
            print(f"{row[0]:>4}  {row[1]:<38} {row[2]:>5} {row[3]:>5} {row[4]:>7} {row[5]:>9} {row[6]:>15} {row[7]:>7} {row[8]:>7}")
        failed = ", ".join(f"{code} {n}" for code, n in sorted(t.failed.items())) or "none"
        print()
        print(f"| faults injected | {len(schedule)} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}) |")
        print(f"| requests sent | {t.sent} (of which {t.cancelled} cancelled by their caller on purpose) |")
        print(f"| completed | {t.completed} |")
        print(f"| failed with a clean error | {sum(t.failed.values())} ({failed}) |")
        print(f"| migrated | {t.migrated} |")
        print(f"| completed by decode worker | {', '.join(f'{w} {n}' for w, n in sorted(t.served_by.items()))} |")
        print(f"| wrong | {len(t.wrong)} |")
        print(f"| hung past the deadline | {len(t.hung)} |")
        print(f"| leaked | {sum(r[7] for r in self.rows)} |")
        print(
            f"| served again after a fault healed | max {max(self.recoveries, default=0):.1f} s (limit: lease TTL {LEASE_TTL_S} s + 5 s) |"
        )
        print(f"| run time | {seconds:.0f} s (seed {self.seed}, {len(schedule)} steps) |")
        for code, samples in sorted(t.failure_samples.items()):
            for sample in samples:
                print(f"  e.g. {code}: {sample}")
        for line in [*t.wrong[:5], *t.hung[:5], *self.violations]:
            print(f"VIOLATION: {line}")
        print("chaos: " + ("FAILED" if self.violations or t.wrong or t.hung else "all invariants held"), flush=True)


_NO_LOAD = agent_pb2.GetStatusResponse().load


def _agent_load(cluster: LocalCluster, worker_id: str):
    """The agent's own load report (Agent.GetStatus, as the cluster's admin), or None when it does not answer."""
    try:
        with grpc_util.channel(cluster.worker_endpoints[worker_id], cluster.credentials.admin) as channel:
            return agent_pb2_grpc.AgentStub(channel).GetStatus(agent_pb2.GetStatusRequest(), timeout=2).load
    except grpc.RpcError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7, help="seed of the fault schedule and the traffic (default %(default)s)")
    parser.add_argument("--steps", type=int, default=16, help="faults to inject, one per step (default %(default)s)")
    parser.add_argument("--log-dir", default=None, help="where process logs go (default: a temp dir, kept)")
    parser.add_argument("--bus", choices=("nats", "nats-agents", "store"), default="nats",
                        help="how load reports and KV events reach the replicas; nats adds the bus's faults; nats-agents has the "
                        "agents publish their load reports and KV batches on it themselves (default %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="kvplane-chaos-"))
    return Chaos(args.seed, args.steps, log_dir, args.bus).run()


if __name__ == "__main__":
    sys.exit(main())
