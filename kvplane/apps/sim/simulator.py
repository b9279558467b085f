"""The cluster in virtual time: the real planner (controlplane/core) routes and admits requests
onto simulated workers (fleet.py), with no sockets, threads or sleeps.

What happens to one request mirrors the gRPC services (controlplane/client_service.py and
dataplane/agent/service.py), with one hop of `hop_s` per RPC message:
1. it arrives at the control plane: Planner.route + Planner.admit on the cluster as the workers
   last reported it (a rejection ends it; the batch queue is not modeled: a rejected batch request
   is counted as rejected), then Planner.dispatched;
2. the decode worker gets it; with a prefill worker, that worker prefills it (a prefill_only
   request) and pins its blocks, and the decode agent tells the control plane that the prefill
   has ended (Planner.remote_prefill_ended, as a relaying replica hears it); with a fetch, the
   holder pins its cached prefix; the decode worker then allocates the blocks it lacks, the
   transfer takes the link's time for the model's real KV bytes (kvplane.hardware.LinkSpec), and
   the blocks are committed to its prefix cache and unpinned at the source. A full decode pool is waited on (AgentTiming.import_wait_s) until steps free
   blocks; if the source fails or the wait runs out, it prefills locally, as the agent does;
3. it runs on the decode worker; its first token reaches the control plane (Planner.prefill_ended)
   and so does its end (Planner.finished with the measured TTFT, TPOT and transfer), as in the servicer.
Load reports and KV event batches reach the planner and the cache index on the agents' periods.

Determinism: workers are created in a fixed order, the planner's rng is seeded, events at equal
times run in the order they were scheduled, and nothing reads a wall clock, except the optional
measurement of the planner's own cost per decision (`measure_cost`), kept apart from the results.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvplane import hardware
from kvplane.apps.sim import decisions as decision_log
from kvplane.apps.sim.clock import EventLoop
from kvplane.apps.sim.fleet import AgentTiming, ImportWait, SimWorker, fitted_step_model
from kvplane.controlplane.core.admission_base import Reject
from kvplane.controlplane.core.index import CacheIndex, KVEvent, StoredEvent
from kvplane.controlplane.core.planner import EARLY_TPOT_TOKENS, Outcome, Plan, Planner, PlannerConfig
from kvplane.controlplane.core.policies.kvplane import KvplaneParams
from kvplane.controlplane.core.pool import cluster_with
from kvplane.controlplane.core.routing import NoCandidateError, RouteRequest
from kvplane.controlplane.core.settings import ClusterSettings
from kvplane.controlplane.core.views import ClusterView, WorkerView
from kvplane.dataplane.engines import EngineCapacityError, EngineInputError, EngineOutput, EngineRequest, SamplingParams
from kvplane.dataplane.engines.sim import SimConfig, SimEngine
from kvplane.types import PRIORITIES, BlockHash, DisaggMode, Priority, Role, WorkerId


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """How many workers of each role, all of one engine configuration."""

    engine: SimConfig
    num_prefill: int = 0
    num_decode: int = 0
    num_both: int = 1

    def validate(self) -> FleetSpec:
        counts = (self.num_prefill, self.num_decode, self.num_both)
        if min(counts) < 0 or sum(counts) == 0:
            raise ValueError(f"a fleet needs at least one worker and no negative counts, got prefill/decode/both {counts}")
        if self.num_decode + self.num_both == 0:
            raise ValueError("a fleet needs a decode or both worker: prefill workers alone cannot answer")
        self.engine.validate()
        return self

    @property
    def num_workers(self) -> int:
        return self.num_prefill + self.num_decode + self.num_both

    def worker_roles(self) -> list[tuple[WorkerId, Role]]:
        out = []
        for role, count in ((Role.PREFILL, self.num_prefill), (Role.DECODE, self.num_decode), (Role.BOTH, self.num_both)):
            out += [(WorkerId(f"{role.value}-{i}"), role) for i in range(count)]
        return out


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of a workload; the prompt is made when it arrives (a trace's would not all fit
    in memory at once)."""

    arrival_s: float
    num_prompt_tokens: int
    max_tokens: int
    make_prompt: Callable[[], Sequence[int]]
    priority: Priority = PRIORITIES[0]
    after: int = -1  # index of a request that must finish first (a chat's previous turn), or -1


@dataclass(slots=True)
class Record:
    """What happened to one request (times in virtual seconds)."""

    index: int
    priority: str
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    sent_s: float = 0.0  # when it reached the control plane (arrival, or later behind its `after`)
    admitted: bool = False
    rejected: bool = False
    failed: bool = False
    first_token_s: float | None = None  # at the control plane
    last_token_s: float | None = None
    finished_s: float | None = None  # when its end reached the control plane
    num_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens not computed (where the prompt was prefilled)
    loaded_tokens: int = 0  # of them, copied back from the host or disk tier
    disk_loaded_tokens: int = 0  # of those, from disk
    decode_worker: str = ""
    prefill_worker: str = ""
    disaggregated: bool = False
    fetched: bool = False
    kv_transfer_bytes: int = 0
    kv_transfer_s: float = 0.0
    kv_wait_s: float = 0.0  # waiting for the decode worker's blocks to pull its KV into
    predicted_ttft_s: float | None = None
    oracle_cached_tokens: int = 0
    infinite_cached_tokens: int = 0  # the bound of a cache that never evicts

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        if self.first_token_s is None or self.last_token_s is None or self.num_tokens < 2:
            return None
        return (self.last_token_s - self.first_token_s) / (self.num_tokens - 1)


@dataclass(slots=True)
class _Flight:
    record: Record
    route: RouteRequest
    plan: Plan | None = None
    dispatch_id: int = 0
    done: bool = False
    arrived_s: float = 0.0  # when it reached its decode worker's agent


@dataclass(slots=True)
class RunResult:
    records: list[Record]
    duration_s: float  # virtual seconds from the first arrival to the last event
    workers: list[SimWorker]
    planner_cost_s: list[float] = field(default_factory=list)  # wall seconds per planned request (measure_cost)
    num_events: int = 0
    index_blocks: int = 0  # distinct block hashes in the cache index at the end
    index_entries: int = 0  # (block, worker, tier) entries at the end


class OracleCache:
    """One pooled LRU prefix cache with every worker's capacity, every tier's together (device +
    host + disk: with write-through the tiers hold copies of each other, so this is an upper
    bound of what they hold), fed in arrival order: the hit rate a router that knew every cache
    and ignored load could reach (the engine's rule applies: the last prompt token is always
    computed). capacity_blocks None: a cache that never evicts, the bound of the trace itself."""

    def __init__(self, capacity_blocks: int | None, block_size: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self._lru: OrderedDict[BlockHash, None] = OrderedDict()

    def feed(self, block_hashes: Sequence[BlockHash], num_prompt_tokens: int) -> int:
        """Cached prompt tokens for this prompt; then its blocks are cached."""
        hit = 0
        for h in block_hashes[: (num_prompt_tokens - 1) // self.block_size]:
            if h not in self._lru:
                break
            hit += 1
        lru = self._lru
        for h in block_hashes:
            lru[h] = None
            lru.move_to_end(h)
        if self.capacity_blocks is not None:
            while len(lru) > self.capacity_blocks:
                lru.popitem(last=False)
        return hit * self.block_size


class Simulator:
    def __init__(
        self,
        fleet: FleetSpec,
        planner_config: PlannerConfig,
        settings: ClusterSettings | None = None,
        *,
        seed: int = 0,
        agent: AgentTiming | None = None,
        disagg: DisaggMode = DisaggMode.AUTO,
        measure_cost: bool = False,
        progress: Callable[[Simulator], None] | None = None,
        progress_every: int = 200_000,
        decisions: decision_log.Sink | None = None,
    ) -> None:
        self.fleet = fleet.validate()
        self.agent = (agent or AgentTiming()).validate()
        self.loop = EventLoop()
        self.settings = settings or ClusterSettings()
        self.planner = Planner(planner_config, random.Random(seed))
        # Discounting the reports that measurements contradict (core/trust.py) is part of kvplane's
        # rule; the other policies route on the reports as they come, as the routers they follow do.
        self.planner.trust.enabled = isinstance(planner_config.router.policy, KvplaneParams)
        self.index = CacheIndex()
        self.disagg = disagg
        self.measure_cost = measure_cost
        self._progress = progress
        self._progress_every = progress_every
        self._decisions = decisions  # each decision with its outcome, when its request ends (decisions.py)
        self._deciding: dict[int, dict] = {}
        config = fleet.engine
        self.link = hardware.link(config.link)
        timing = config.timing()  # one object shared by every worker (and the profile fit's cache key)
        roles = fleet.worker_roles()
        self.workers: list[SimWorker] = []
        for i, (worker_id, role) in enumerate(roles):
            engine_config = dataclasses.replace(config, payload_bytes=0)  # nothing moves bytes here
            engine = SimEngine(engine_config, clock=self.loop, timing=timing)
            latency = fitted_step_model(timing, config, engine.info.max_context)
            worker = SimWorker(worker_id, role, engine, self.loop, self.agent, i / len(roles), latency, self._reported, self._kv_events)
            self.workers.append(worker)
        self._by_id = {w.worker_id: w for w in self.workers}
        # The planner's view, updated row by row as workers report (as the control plane's is).
        self._cluster = ClusterView(tuple(w.view for w in self.workers), self.index)
        self._reports: dict[WorkerId, WorkerView] = {}
        first = self.workers[0].engine
        self.model_name = first.info.model
        self.block_size = first.info.layout.block_size
        self.block_nbytes = first.info.layout.block_nbytes
        capacity = sum(w.engine.load().num_total_blocks for w in self.workers)
        capacity += len(self.workers) * (config.host_blocks() + config.disk_blocks() if config.host_gib else 0)
        self.oracle = OracleCache(capacity, self.block_size)
        self.infinite = OracleCache(None, self.block_size)
        self._records: list[Record] = []
        self._flights: dict[int, _Flight] = {}
        self._waiting_on: dict[int, list[int]] = {}  # request index -> requests waiting for it to finish
        self._finished: set[int] = set()
        self._requests: Sequence[SimRequest] = ()
        self._cost_s: list[float] = []
        for w in self.workers:  # their first report and (empty) snapshot
            self.index.apply_snapshot(w.worker_id, 0, {})

    # -- control plane: what the workers report -------------------------------------------------
    def _reported(self, worker: SimWorker) -> None:
        self._reports[worker.worker_id] = worker.view
        self.planner.load_reported(worker.worker_id, self.loop.now, sampled_at=self.loop.now)  # virtual time: exact

    def _kv_events(self, worker: SimWorker, events: list[KVEvent]) -> None:
        self.index.apply_batch(worker.worker_id, worker.kv_seq, events)
        for e in events:
            if isinstance(e, StoredEvent):
                self.planner.kv_stored(worker.worker_id, e.block_hashes)

    # -- running a workload ---------------------------------------------------------------------
    def run(self, requests: Sequence[SimRequest], until_s: float | None = None) -> RunResult:
        """Plays the requests (arrival times from 0) and runs until every one has ended."""
        self._requests = requests
        for i, r in enumerate(requests):
            rec = Record(i, r.priority, r.arrival_s, r.num_prompt_tokens, r.max_tokens)
            self._records.append(rec)
            if r.after >= 0:
                self._waiting_on.setdefault(r.after, []).append(i)
            else:
                self.loop.at(r.arrival_s, self._arrive, i)
        # The fleet's objects live for the whole run: keep them out of the cyclic GC's scans, or
        # its full collections (seconds, with a thousand workers) land inside planner decisions.
        gc.collect()
        gc.freeze()
        try:
            if self._progress is None:
                self.loop.run(until_s)
            else:  # in slices of events, reporting between them
                while self.loop.pending and (until_s is None or self.loop.now < until_s):
                    self.loop.run(until_s, max_events=self._progress_every)
                    self._progress(self)
        finally:
            gc.unfreeze()
        for i in sorted(self._deciding):  # decided, not ended when the run stopped
            self._decisions(decision_log.ended(self._deciding.pop(i), self._records[i]))
        start = min((r.arrival_s for r in requests), default=0.0)
        index_counts = self.index.blocks_by_tier()
        return RunResult(
            records=self._records,
            duration_s=self.loop.now - start,
            workers=self.workers,
            planner_cost_s=self._cost_s,
            num_events=self.loop.num_events,
            index_blocks=self.index.num_block_hashes(),
            index_entries=sum(sum(c.values()) for c in index_counts.values()),
        )

    @property
    def num_ended(self) -> int:
        return len(self._finished)

    def _arrive(self, i: int) -> None:
        spec, rec = self._requests[i], self._records[i]
        now = self.loop.now
        rec.sent_s = now
        route = RouteRequest(self.model_name, spec.make_prompt(), spec.max_tokens, self.disagg, priority=spec.priority)
        if self._reports:
            self._cluster = cluster_with(self._cluster, self._reports, None)
            self._reports = {}
        view = self._cluster
        started = time.thread_time() if self.measure_cost else 0.0
        try:
            routed = self.planner.route(route, view, self.settings, now)
            verdict = self.planner.admit(routed, self.settings)
        except NoCandidateError:
            rec.failed = True
            self._end(i)
            return
        if self.measure_cost:
            self._cost_s.append(time.thread_time() - started)
        rec.oracle_cached_tokens = self.oracle.feed(routed.decision.block_hashes, rec.prompt_tokens)
        rec.infinite_cached_tokens = self.infinite.feed(routed.decision.block_hashes, rec.prompt_tokens)
        if self._decisions is not None:
            self._deciding[i] = decision_log.decided(i, spec.arrival_s, now, routed, verdict)
        if isinstance(verdict, Reject):
            rec.rejected = True
            self._end(i)
            return
        plan = verdict
        rec.admitted = True
        rec.decode_worker = plan.decode_worker
        rec.prefill_worker = plan.prefill_worker or plan.decode_worker
        rec.disaggregated = plan.disaggregated
        rec.predicted_ttft_s = plan.prediction.ttft_s if plan.prediction is not None else None
        flight = _Flight(rec, route, plan, self.planner.dispatched(plan, now))
        self._flights[i] = flight
        self.loop.after(self.agent.hop_s, self._at_decode, flight)

    # -- the decode agent -------------------------------------------------------------------------
    def _at_decode(self, f: _Flight) -> None:
        f.arrived_s = self.loop.now  # its place in the decode worker's queue (EngineRequest.queued_since)
        plan = f.plan
        if plan.prefill_worker is not None:
            self.loop.after(self.agent.hop_s, self._at_prefill, f)
        elif plan.fetch_from is not None:
            self.loop.after(self.agent.hop_s, self._pin_cached, f)
        else:
            self._generate(f, [])

    def _at_prefill(self, f: _Flight) -> None:
        worker = self._by_id[f.plan.prefill_worker]
        request = EngineRequest(
            f"{f.record.index}:prefill", list(f.route.prompt_token_ids), SamplingParams(max_tokens=1), prefill_only=True
        )
        try:
            worker.submit(request, lambda out: self._prefilled(f, worker, out))
        except (EngineInputError, EngineCapacityError):
            self.loop.after(self.agent.hop_s, self._local_fallback, f)

    def _prefilled(self, f: _Flight, worker: SimWorker, out: EngineOutput) -> None:
        if not out.finished:
            return
        if out.error or out.finish_reason == "abort":
            worker.engine.unpin(out.pinned_block_ids)
            self.loop.after(self.agent.hop_s, self._local_fallback, f)
            return
        worker.num_prefill_tokens += out.num_prompt_tokens - out.num_cached_tokens
        _count_cached(f.record, out)
        # The decode agent hears of it a hop later and tells the control plane (report_prefill_done).
        at_cp = self.loop.now + 2 * self.agent.hop_s
        self.loop.at(at_cp, self.planner.remote_prefill_ended, f.dispatch_id, at_cp)
        self.loop.after(self.agent.hop_s, self._pull, f, worker, out.block_hashes, out.pinned_block_ids, False)

    def _pin_cached(self, f: _Flight) -> None:
        source = self._by_id[f.plan.fetch_from]
        hashes, block_ids = source.engine.pin_cached_prefix(f.route.prompt_token_ids)
        source.kick()
        self.loop.after(self.agent.hop_s, self._pull, f, source, hashes, block_ids, True)

    def _pull(self, f: _Flight, source: SimWorker, hashes: list[BlockHash], pinned: list[int], fetch: bool) -> None:
        decode = self._by_id[f.plan.decode_worker]
        missing = decode.engine.missing_blocks(hashes)
        if not missing:
            self.loop.after(0.0, self._pulled, f, source, [], pinned, [], 0.0, fetch)
            return
        asked_at = self.loop.now

        def ready(dst: list[int]) -> None:
            into = missing
            f.record.kv_wait_s = self.loop.now - asked_at
            if f.record.kv_wait_s > 0:  # it waited: others may have brought some of its blocks in
                into = decode.engine.missing_blocks(hashes)[: len(dst)]
                decode.engine.abort_import(dst[len(into) :])
                dst = dst[: len(into)]
            seconds = self.link.transfer_seconds(len(dst) * self.block_nbytes)
            self.loop.after(seconds, self._pulled, f, source, [hashes[i] for i in into], pinned, dst, seconds, fetch)

        wait = decode.allocate_for_import(len(missing), ready)
        if not wait.served:  # no room to pull into yet: wait for it, then prefill here instead
            self.loop.after(self.agent.import_wait_s, self._import_timed_out, f, source, pinned, wait)

    def _import_timed_out(self, f: _Flight, source: SimWorker, pinned: list[int], wait: ImportWait) -> None:
        if wait.served:
            return
        wait.cancelled = True
        f.record.kv_wait_s = self.agent.import_wait_s
        self._release(source, pinned)
        self._local_fallback(f)

    def _pulled(
        self, f: _Flight, source: SimWorker, hashes: list[BlockHash], pinned: list[int], dst: list[int], seconds: float, fetch: bool
    ) -> None:
        decode = self._by_id[f.plan.decode_worker]
        held = decode.engine.commit_import(hashes, dst) if dst else []
        self._release(source, pinned)
        rec = f.record
        rec.kv_transfer_bytes = len(dst) * self.block_nbytes
        rec.kv_transfer_s = seconds
        rec.fetched = fetch and bool(dst)
        self._generate(f, held)

    def _release(self, source: SimWorker, pinned: list[int]) -> None:
        if pinned:
            source.engine.unpin(pinned)
            source.kick()  # freed blocks may let a queued request in

    def _local_fallback(self, f: _Flight) -> None:
        """The remote prefill or the fetch failed: prefill on the decode worker, as the agent does."""
        rec = f.record
        rec.prefill_worker, rec.disaggregated, rec.fetched = rec.decode_worker, False, False
        rec.cached_tokens = rec.loaded_tokens = rec.disk_loaded_tokens = 0
        self._generate(f, [])

    def _generate(self, f: _Flight, held: list[int]) -> None:
        decode = self._by_id[f.plan.decode_worker]
        sampling = SamplingParams(max_tokens=f.route.max_tokens, ignore_eos=True)
        request = EngineRequest(
            str(f.record.index), list(f.route.prompt_token_ids), sampling, held_block_ids=held, queued_since=f.arrived_s
        )
        try:
            decode.submit(request, lambda out: self._decoded(f, decode, out))
        except (EngineInputError, EngineCapacityError):
            if held:
                decode.engine.unpin(held)
            f.record.failed = True
            self.loop.after(self.agent.hop_s, self._finish, f, None)

    def _decoded(self, f: _Flight, worker: SimWorker, out: EngineOutput) -> None:
        rec = f.record
        at_cp = self.loop.now + self.agent.hop_s
        if out.new_token_ids:
            if rec.first_token_s is None:
                rec.first_token_s = at_cp
                self.loop.at(at_cp, self.planner.prefill_ended, f.dispatch_id, at_cp)
            rec.last_token_s = at_cp
            before = rec.num_tokens
            rec.num_tokens += len(out.new_token_ids)
            if before < EARLY_TPOT_TOKENS <= rec.num_tokens and not out.finished:
                self.loop.at(at_cp, self.planner.decoding, f.dispatch_id, at_cp, rec.tpot_s)
            worker.num_generated_tokens += len(out.new_token_ids)
        if not out.finished:
            return
        if not rec.disaggregated:
            _count_cached(rec, out)
            worker.num_prefill_tokens += out.num_prompt_tokens - out.num_cached_tokens
        if out.error or out.finish_reason == "abort":
            rec.failed = True
        self.loop.at(at_cp, self._finish, f, out)

    def _finish(self, f: _Flight, out: EngineOutput | None) -> None:
        rec = f.record
        rec.finished_s = self.loop.now
        outcome = None
        if not rec.failed:
            outcome = Outcome(
                ttft_s=rec.ttft_s, tpot_s=rec.tpot_s, kv_transfer_bytes=rec.kv_transfer_bytes, kv_transfer_s=rec.kv_transfer_s
            )
        self.planner.finished(f.dispatch_id, self.loop.now, outcome)
        self._flights.pop(rec.index, None)
        self._end(rec.index)

    def _end(self, i: int) -> None:
        """Request i has ended: what waited for it may go (at its own arrival time or now)."""
        self._finished.add(i)
        entry = self._deciding.pop(i, None)
        if entry is not None:
            self._decisions(decision_log.ended(entry, self._records[i]))
        for j in self._waiting_on.pop(i, ()):
            self.loop.at(max(self.loop.now, self._requests[j].arrival_s), self._arrive, j)


def _count_cached(rec: Record, out: EngineOutput) -> None:
    """The prompt's cached tokens where it was prefilled, and of them those a lower tier held."""
    rec.cached_tokens = out.num_cached_tokens
    rec.loaded_tokens = out.num_loaded_tokens
    rec.disk_loaded_tokens = out.num_disk_loaded_tokens
