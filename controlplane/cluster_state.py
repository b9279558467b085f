"""Each replica's view of the cluster, rebuilt from the store and the bus alone.

Workers (under their leases), settings and snapshot requests come from keys under /kvplane/:
list, then watch. When a worker's lease expires (the agent died) the store deletes its key, which
removes it from routing and from the index, with nobody calling it. Load reports and KV event
batches come from the bus (controlplane/bus/): with the store bus they are keys under the worker's
lease in the same watch; with the in-process or NATS bus they never touch the store, and a message
applies only to the registration (lease) it names. One that names a registration this replica has
not seen yet (the store watch and the bus deliver independently) is held until it appears, for
at most PENDING_MAX_AGE_S.

KV events are numbered end to end: the agent numbers its batches, the bus keeps one worker's in
order, and every load report names the last batch the agent published (`kv_seq`). A batch number
that skips one, a first batch that is neither a snapshot nor batch 1 (history the bus no longer
retains), or a report naming a batch the index never got is a gap (on a bus whose load reports may
overtake batches, only once the batch is KV_LATE_S late): the replica writes
/kvplane/resync/<worker>, the replica serving that worker's next load report asks it for a
snapshot, and the snapshot replaces what the index held for it (and clears the request). A watch
that fell behind the store's compacted history lists everything again instead.

The index credits a worker only with the blocks of requests this replica routed there
(core/index.py, `credit_routed_only`): the servicer reports each dispatch (`routed`), and the
blocks a worker reports beyond those stay uncredited until a routed request covers them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvplane.block_hash import chain_hash, root_hash
from kvplane.bus import mac_valid
from kvplane.controlplane import keys
from kvplane.controlplane.batch_limits import BatchLimits, batch_problem
from kvplane.controlplane.bus import Bus, BusError, BusMessage, StoreBus
from kvplane.controlplane.core.index import NO_SEQ, CacheIndex, ClearedEvent, RemovedEvent, StoredEvent
from kvplane.controlplane.core.planner import Plan
from kvplane.controlplane.core.pool import WorkerTable, cluster_with
from kvplane.controlplane.core.settings import ClusterSettings
from kvplane.controlplane.core.step_pool import StepModelPool
from kvplane.controlplane.core.views import DEFAULT_CHUNK_TOKENS, ClusterView, WorkerLoadView, WorkerView
from kvplane.controlplane.pause import PauseDetector
from kvplane.controlplane.secrets import ClusterSecrets
from kvplane.controlplane.store.base import EventType, Store, StoreCompacted, StoreError, WatchEvent
from kvplane.convert import layout_from_pb, role_from_pb, tier_from_pb
from kvplane.latency import MIN_ONLINE_SAMPLES, StepTimeModel
from kvplane.security.limits import MAX_RUNNING_LISTED, clip
from kvplane.types import BlockHash, Tier, WorkerId
from kvplane.v1 import common_pb2, registry_pb2

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WorkerEntry:
    info: common_pb2.WorkerInfo
    load: common_pb2.WorkerLoad
    state: int
    load_at: float  # monotonic time of the last load report
    latency: StepTimeModel | None = None  # the worker's step-time model, from its load reports
    kind: tuple = ()  # worker_kind(info): the workers priced with one step-time model (core/step_pool.py)
    lease: int = 0  # the registration's lease: bus messages naming another are not this registration's
    report_seq: int = 0  # the last numbered load report applied for this lease (ReportLoadRequest.report_seq)
    latency_pb: common_pb2.LatencyModel | None = None  # the step-time model the last report carried, as sent


def events_from_pb(events: Sequence[common_pb2.KVEvent]) -> list[StoredEvent | RemovedEvent | ClearedEvent]:
    out: list[StoredEvent | RemovedEvent | ClearedEvent] = []
    for ev in events:
        kind = ev.WhichOneof("event")
        if kind == "stored":
            out.append(StoredEvent(tuple(BlockHash(h) for h in ev.stored.block_hashes), tier_from_pb(ev.stored.tier)))
        elif kind == "removed":
            out.append(RemovedEvent(tuple(BlockHash(h) for h in ev.removed.block_hashes), tier_from_pb(ev.removed.tier)))
        elif kind == "cleared":
            out.append(ClearedEvent())
    return out


STORE_PROBE_INTERVAL_S = 0.5  # how often the replica checks that the store answers
TRUST_AFTER_PAUSE_S = 1.0  # after this replica was itself paused, the store's health counts again only this much later
PENDING_MAX_AGE_S = 10.0  # bus messages of a registration the store has not shown yet are kept this long
PENDING_MAX_MESSAGES = 256  # and at most this many per registration
DEFAULT_BATCH_LIMITS = BatchLimits()
KV_LATE_S = 1.0  # on an unordered bus, a batch a load report names is missing only once it is this late


class ClusterState:
    def __init__(
        self,
        store: Store,
        *,
        bus: Bus | None = None,
        credit_routed_only: bool = True,
        bus_keys: ClusterSecrets | None = None,
        batch_limits: BatchLimits = DEFAULT_BATCH_LIMITS,
    ) -> None:
        """`bus_keys`: when given, a bus message applies only with a valid MAC (kvplane/bus.py), for
        a bus that workers can publish on themselves; a KV batch signed by its worker then only
        within `batch_limits`, as a replica checks one it is given by a call."""
        self._store = store
        self.bus = bus if bus is not None else StoreBus(store)
        # A registration's key is derived once, not per message (an HMAC each).
        self._worker_key = self._replica_key = None  # (worker id, lease) -> key; None: MACs are not checked
        if bus_keys is not None:
            self._worker_key = functools.lru_cache(maxsize=1 << 16)(bus_keys.session_token)
            self._replica_key = functools.lru_cache(maxsize=1 << 16)(bus_keys.replica_bus_key)
        self._batch_limits = batch_limits
        self._stopped = False
        # Bus messages of registrations not seen yet: (worker, lease) -> (first held at, messages).
        self._pending: dict[tuple[WorkerId, int], tuple[float, list[BusMessage]]] = {}
        self._awaited: dict[WorkerId, tuple[int, float]] = {}  # a KV batch a report named: (seq, when first named)
        self.bus_messages = {"load": 0, "kv": 0}  # applied from the bus (not the store bus), by kind
        # Bus messages dropped: a missing or wrong MAC, a load report numbered at or below the last applied, a malformed one.
        self.bus_rejected = {"mac": 0, "replayed": 0, "invalid": 0}
        self.bus_ok = True  # the last bus probe answered
        self.store_ok = True  # the last store probe answered
        self._drop_bus_until = 0.0
        # Monotonic time a probe of the store, and of the bus the reports travel on, last succeeded.
        self.store_ok_at: float | None = None
        # ... and the latest load report applied, from any worker: the probes answering does not
        # show that reports get through (a watch that broke or lags, a bus subscription that did).
        self.last_report_at: float | None = None
        self._probe_task: asyncio.Task | None = None
        # This replica's own pauses: afterwards every report looks old until the watch catches up,
        # so silence is not judged until the store has been heard from again a while later.
        self.pauses = PauseDetector()
        self.pauses.on_pause.append(self._after_pause)
        self._trust_store_after = 0.0
        self.workers: dict[WorkerId, WorkerEntry] = {}
        # Bumped when a worker joins, leaves or registers again with other info: what a reader
        # derives from every worker's info (ClientService's per-model facts) is redone only then.
        self.workers_generation = 0
        # The step-time model each worker is priced with: its kind's (core/step_pool.py).
        self.step_models = StepModelPool()
        self._views: dict[WorkerId, tuple] = {}  # worker -> (entry, state, load_at, priced model it was built from, its WorkerView)
        # The last view handed out, and what changed since: workers whose entry changed, and
        # whether workers joined or left (then the next view is built afresh).
        self._last_view: ClusterView | None = None
        self._changed: set[WorkerId] = set()
        self._membership_changed = True
        self._stated_link: float | None = None  # the workers' stated KV link rate (ClusterView); None: to recount
        # A worker's KV events are claims: credit what was routed (unless the operator trusts every worker).
        self.index = CacheIndex(credit_routed_only=credit_routed_only)
        self.settings = ClusterSettings()
        self._watch_task: asyncio.Task | None = None
        self._synced = asyncio.Event()
        self.revision = 0
        # Listeners (the planner): blocks a worker reported stored, a load report's arrival (with its
        # monotonic time), workers gone.
        self.kv_stored_listeners: list[Callable[[WorkerId, Sequence[BlockHash]], None]] = []
        self.load_reported_listeners: list[Callable[[WorkerId, float, float | None], None]] = []
        self.worker_removed_listeners: list[Callable[[WorkerId], None]] = []
        # Snapshot requests in the store (any replica's): worker -> the seq after which a gap was seen.
        self.resync_requests: dict[WorkerId, int] = {}
        self.num_gaps_detected = 0  # by this replica
        self._pending_writes: set[asyncio.Task] = set()

    async def start(self) -> None:
        self.revision = await self._list()
        self.store_ok_at = time.monotonic()
        self._watch_task = asyncio.create_task(self._watch(self.revision + 1), name="cluster-watch")
        if not self.bus.carried_by_store:
            await self.bus.subscribe(self._on_bus_message)
        self._probe_task = asyncio.create_task(self._probe(), name="store-probe")
        for task in (self._watch_task, self._probe_task):
            if task is not None:
                task.add_done_callback(_log_if_it_died)
        self.pauses.start()
        self._synced.set()

    async def _list(self) -> int:
        """Applies every key under /kvplane/ (workers first, so that their load and KV keys attach
        to them); workers the listing lacks are gone. Returns the listing's revision."""
        items, revision = await self._store.get_prefix(keys.ROOT)
        listed = {WorkerId(kv.key[len(keys.WORKERS) :]) for kv in items if kv.key.startswith(keys.WORKERS)}
        for worker_id in [w for w in self.workers if w not in listed]:
            self._apply(WatchEvent(EventType.DELETE, keys.worker_key(worker_id), b"", revision))
        self.resync_requests = {w: s for w, s in self.resync_requests.items() if w in listed}
        # Snapshot requests before load reports, so that a known gap is not found (and asked for) again.
        for kv in sorted(items, key=lambda kv: (not kv.key.startswith(keys.WORKERS), not kv.key.startswith(keys.RESYNC))):
            # With its lease: bus messages apply only to the registration (lease) they name, and a
            # replica that started after its workers registered held every one of them until it aged out.
            self._apply(WatchEvent(EventType.PUT, kv.key, kv.value, kv.mod_revision, kv.lease))
        return revision

    def snapshot_requested(self, worker_id: str) -> bool:
        """Some replica asked this worker for a full KV snapshot and none has arrived since."""
        return WorkerId(worker_id) in self.resync_requests

    async def stop(self) -> None:
        await self.pauses.stop()
        self._stopped = True  # what the bus still delivers is not applied
        for task in (self._watch_task, self._probe_task):
            if task:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass

    async def _probe(self) -> None:
        """Notes when the store and the bus last answered, so that silent workers can be told from
        a silent store or bus (either stops every report at once)."""
        while True:
            await asyncio.sleep(STORE_PROBE_INTERVAL_S)
            sent_at = time.monotonic()
            self._drop_expired_held(sent_at)
            try:
                await self._store.get(keys.TICKET_SIGNING_KEY)
                self.store_ok = True
            except StoreError as e:
                self.store_ok = False
                log.debug("store probe failed: %s", e)
                continue
            try:
                await self.bus.probe()
                self.bus_ok = True
            except BusError as e:
                self.bus_ok = False
                log.debug("bus probe failed: %s", e)
                continue
            if sent_at >= self._trust_store_after:
                self.store_ok_at = sent_at  # the store and the bus worked at least as late as this

    def _after_pause(self, gap_s: float) -> None:
        self.store_ok_at = None
        self._trust_store_after = time.monotonic() + TRUST_AFTER_PAUSE_S

    async def _watch(self, start_revision: int) -> None:
        while True:
            try:
                async for event in self._store.watch_prefix(keys.ROOT, start_revision=start_revision):
                    self._apply(event)
                    self.revision = event.mod_revision
                    start_revision = event.mod_revision + 1
                return  # store closed
            except asyncio.CancelledError:
                raise
            except StoreCompacted as e:
                # History we missed is gone: list everything again, then watch from there.
                log.warning("store watch fell behind compaction (%s); listing the cluster again", e)
                try:
                    start_revision = await self._list() + 1
                except StoreError as list_error:
                    log.warning("listing the cluster failed (%s); retrying", list_error)
                    await asyncio.sleep(0.5)
            except Exception as e:  # a broken watch must not leave a stale view: resume where it stopped
                log.warning("store watch failed (%s); resuming from revision %d", e, start_revision)
                await asyncio.sleep(0.5)

    def drop_bus_messages(self, seconds: float) -> None:
        """Fault injection: miss what the bus brings for `seconds` (a replica that fell behind)."""
        self._drop_bus_until = time.monotonic() + seconds
        log.warning("fault injection: dropping bus messages for %.1f s", seconds)

    def _on_bus_message(self, message: BusMessage) -> None:
        if self._stopped or (self._drop_bus_until and time.monotonic() < self._drop_bus_until):
            return
        try:
            self._apply_bus(message)
        except Exception:
            log.exception("ignoring a malformed %s message from the bus", message.kind)

    # -- applying store events and bus messages --------------------------------------------

    def _apply(self, event: WatchEvent) -> None:
        key = event.key
        try:
            if key.startswith(keys.WORKERS):
                self._apply_worker(WorkerId(key[len(keys.WORKERS) :]), event)
            elif key.startswith(keys.LOAD) and event.type is EventType.PUT:
                self._apply_load(WorkerId(key[len(keys.LOAD) :]), registry_pb2.ReportLoadRequest.FromString(event.value))
            elif key.startswith(keys.KV) and event.type is EventType.PUT:
                worker_id, seq = keys.parse_kv_key(key)
                self._apply_kv(WorkerId(worker_id), seq, registry_pb2.PublishKVEventsRequest.FromString(event.value))
            elif key.startswith(keys.SETTINGS):
                self._apply_setting(key[len(keys.SETTINGS) :], event)
            elif key.startswith(keys.RESYNC):
                worker_id = WorkerId(key[len(keys.RESYNC) :])
                if event.type is EventType.DELETE:
                    self.resync_requests.pop(worker_id, None)
                else:
                    self.resync_requests[worker_id] = int(event.value or b"0")
        except Exception:
            log.exception("ignoring malformed store entry %s", key)

    def _apply_worker(self, worker_id: WorkerId, event: WatchEvent) -> None:
        if event.type is EventType.DELETE:
            if self.workers.pop(worker_id, None) is not None:
                self._membership_changed = True
                self.workers_generation += 1
                self._stated_link = None
            self._changed |= self.step_models.remove(worker_id)
            self._views.pop(worker_id, None)
            self.index.remove_worker(worker_id)
            self.resync_requests.pop(worker_id, None)
            self._awaited.pop(worker_id, None)
            for listener in self.worker_removed_listeners:
                listener(worker_id)
            log.info("worker %s left (lease expired or deregistered)", worker_id)
            return
        info = common_pb2.WorkerInfo.FromString(event.value)
        lease = int(event.lease or 0)
        old = self.workers.get(worker_id)
        if old is not None and old.info == info:
            if old.lease != lease:  # the same worker registered again; its next snapshot refreshes the index
                old.lease, old.report_seq = lease, 0
            self._release_pending(worker_id, lease)
            return
        self._stated_link = None
        if old is not None:
            # A different incarnation: its cache starts from the snapshot it publishes next.
            self.index.remove_worker(worker_id)
            self._changed.add(worker_id)
        else:
            self._membership_changed = True
        entry = WorkerEntry(
            info=info, load=common_pb2.WorkerLoad(), state=info.state, load_at=time.monotonic(), kind=worker_kind(info), lease=lease
        )
        self.workers[worker_id] = entry
        self.workers_generation += 1
        self._changed |= self.step_models.update(worker_id, entry.kind, None)
        log.info("worker %s joined: %s at %s", worker_id, common_pb2.Role.Name(info.role), info.endpoint)
        self._release_pending(worker_id, lease)

    @property
    def num_bus_held(self) -> int:
        """Bus messages held for registrations not seen yet."""
        return sum(len(messages) for _, messages in self._pending.values())

    def lease_of(self, worker_id: str) -> int | None:
        """The lease this replica knows the worker registered under (None: not registered here yet)."""
        entry = self.workers.get(WorkerId(worker_id))
        return entry.lease if entry is not None else None

    def _apply_bus(self, message: BusMessage) -> None:
        parsed = (registry_pb2.ReportLoadRequest if message.kind == "load" else registry_pb2.PublishKVEventsRequest).FromString(
            message.payload
        )
        if self._worker_key is not None:
            refusal = self._bus_refusal(message, parsed)
            if refusal is not None:
                self._reject(refusal, message.kind, parsed.worker_id)
                return
        worker_id = WorkerId(parsed.worker_id)
        entry = self.workers.get(worker_id)
        if entry is None or entry.lease != parsed.lease_id:
            self._hold(worker_id, parsed.lease_id, message)
            return
        self.bus_messages[message.kind] += 1
        if message.kind == "load":
            self._apply_load(worker_id, parsed)
        else:
            self._apply_kv(worker_id, parsed.seq, parsed)

    def _bus_refusal(self, message: BusMessage, parsed) -> str | None:
        """Why a message on a bus that workers publish on must not apply (None: it may): no valid
        MAC, or what the registry would refuse from the worker's call."""
        worker_id, lease, payload = parsed.worker_id, parsed.lease_id, message.payload
        signed_by_worker = mac_valid(self._worker_key(worker_id, lease), message.kind, payload, message.mac)
        if message.kind == "load":
            if not signed_by_worker:
                return "mac"
            return "invalid" if len(parsed.load.running_remaining_tokens) > MAX_RUNNING_LISTED else None
        if not signed_by_worker:  # a replica's, which checked the batch before it published it
            return None if mac_valid(self._replica_key(worker_id, lease), "kv", payload, message.mac) else "mac"
        return "invalid" if batch_problem(parsed, self._batch_limits, self.index.num_blocks(WorkerId(worker_id))) else None

    def _reject(self, reason: str, kind: str, worker_id: str) -> None:
        self.bus_rejected[reason] += 1
        if sum(self.bus_rejected.values()) % 100 == 1:  # a flood logs one line in a hundred
            log.warning("dropped a %s message for worker %s from the bus (%s); %s so far", kind, clip(worker_id), reason, self.bus_rejected)

    def _hold(self, worker_id: WorkerId, lease: int, message: BusMessage) -> None:
        """A message of a registration the store watch has not shown (yet, or ever: a dead one)."""
        now = time.monotonic()
        held = self._pending.get((worker_id, lease))
        if held is None:
            self._drop_expired_held(now)
            held = self._pending[(worker_id, lease)] = (now, [])
        if len(held[1]) < PENDING_MAX_MESSAGES:
            held[1].append(message)  # beyond it a KV batch is lost: a gap, and a snapshot is asked for

    def _drop_expired_held(self, now: float) -> None:
        """Held messages older than PENDING_MAX_AGE_S go: dropped here and when a registration is
        first held (after a burst of dead leases' reports they stayed, and `kvplane_bus_held`
        counted them, until some other registration's message was held)."""
        for key in [k for k, (since, _) in self._pending.items() if now - since > PENDING_MAX_AGE_S]:
            del self._pending[key]

    def _release_pending(self, worker_id: WorkerId, lease: int) -> None:
        held = self._pending.pop((worker_id, lease), None)
        for message in held[1] if held else ():
            self._apply_bus(message)

    def _apply_load(self, worker_id: WorkerId, report: registry_pb2.ReportLoadRequest) -> None:
        entry = self.workers.get(worker_id)
        if entry is None:
            return
        if report.report_seq:
            if report.report_seq <= entry.report_seq:  # applied already: a copy, or the bus replaying its latest
                self.bus_rejected["replayed"] += 1
                return
            entry.report_seq = report.report_seq
        self._check_named_batch(worker_id, report.kv_seq)
        entry.load = report.load
        entry.state = report.state or entry.state
        entry.load_at = self.last_report_at = time.monotonic()
        self._changed.add(worker_id)
        if report.HasField("latency") and report.latency != entry.latency_pb:  # most reports repeat the last one's model
            entry.latency_pb = report.latency
            model = StepTimeModel.from_pb(report.latency)
            if model is not None and (model.seeded_from_profile or model.num_samples >= MIN_ONLINE_SAMPLES):
                entry.latency = model  # (a model from a handful of live steps prices noise: kvplane/latency.py)
                self._changed |= self.step_models.update(worker_id, entry.kind, entry.latency)
        # When the agent sampled it, on our monotonic clock (None: the report does not say; a
        # clock ahead of ours counts as sampled on arrival).
        sampled_at = None
        if report.load.sampled_at_unix_s > 0:
            sampled_at = entry.load_at - max(time.time() - report.load.sampled_at_unix_s, 0.0)
        for listener in self.load_reported_listeners:
            listener(worker_id, entry.load_at, sampled_at)

    def _check_named_batch(self, worker_id: WorkerId, named_seq: int) -> None:
        """A load report names the last batch the agent published: one the index lacks was lost (on
        an ordered bus it would have come first; on another, once it is KV_LATE_S late)."""
        last = self.index.last_seq(worker_id)
        if not named_seq > last >= 0:
            self._awaited.pop(worker_id, None)
            return
        if self.bus.ordered:
            self._gap(worker_id, last, f"its load report names KV batch {named_seq}")
            return
        now = time.monotonic()
        awaited = self._awaited.get(worker_id)
        if awaited is None or last >= awaited[0]:
            self._awaited[worker_id] = (named_seq, now)
        elif now - awaited[1] >= KV_LATE_S:
            del self._awaited[worker_id]
            self._gap(worker_id, last, f"its load report named KV batch {awaited[0]} {now - awaited[1]:.1f} s ago")

    def _apply_kv(self, worker_id: WorkerId, seq: int, batch: registry_pb2.PublishKVEventsRequest) -> None:
        events = events_from_pb(batch.events)
        if batch.snapshot:
            by_tier: dict[Tier, list[BlockHash]] = {}
            for ev in events:
                if isinstance(ev, StoredEvent):
                    by_tier.setdefault(ev.tier, []).extend(ev.block_hashes)
            self.index.apply_snapshot(worker_id, seq, by_tier)
            requested = self.resync_requests.get(worker_id)
            if requested is not None and seq > requested:
                self._write(self._store.delete(keys.resync_key(worker_id)), f"clearing the snapshot request of {worker_id}")
        else:
            last = self.index.last_seq(worker_id)
            if last != NO_SEQ and seq > last + 1:
                self._gap(worker_id, last, f"batch {seq} follows batch {last}")
            elif last == NO_SEQ and seq > 1:
                self._gap(worker_id, last, f"its first batch here is batch {seq}, not a snapshot")
            self.index.apply_batch(worker_id, seq, events)
        for ev in events:
            if isinstance(ev, StoredEvent):
                for listener in self.kv_stored_listeners:
                    listener(WorkerId(worker_id), ev.block_hashes)

    def _gap(self, worker_id: WorkerId, last_seq: int, why: str) -> None:
        """A lost KV batch: ask the worker (through whichever replica it reports to) for a snapshot."""
        if worker_id in self.resync_requests or worker_id not in self.workers:
            return
        self.num_gaps_detected += 1
        self.resync_requests[worker_id] = last_seq  # at once here; other replicas see the key
        log.warning("gap in the KV events of %s (%s); asking it for a snapshot", worker_id, why)
        self._write(self._store.put(keys.resync_key(worker_id), str(last_seq).encode()), f"requesting a snapshot of {worker_id}")

    def _write(self, coro, what: str) -> None:
        """A store write from the (synchronous) watch handler, in the background."""

        async def run():
            try:
                await coro
            except StoreError as e:
                log.warning("%s failed: %s", what, e)

        task = asyncio.get_running_loop().create_task(run())
        self._pending_writes.add(task)
        task.add_done_callback(self._pending_writes.discard)

    def _apply_setting(self, name: str, event: WatchEvent) -> None:
        values = dict(self.settings.values)
        if event.type is EventType.DELETE:
            values.pop(name, None)
        else:
            values[name] = event.value.decode()
        self.settings = ClusterSettings(values)
        log.info("setting %s = %r", name, values.get(name))

    # -- the view the planner plans on ----------------------------------------------------------

    def routed(self, plan: Plan) -> None:
        """`plan` was dispatched: its workers compute (or import) the prompt's blocks, which the
        index may now credit them with when they report them."""
        block_hashes = plan.decision.block_hashes
        self.index.vouch(plan.decode_worker, block_hashes)
        if plan.prefill_worker is not None:
            self.index.vouch(plan.prefill_worker, block_hashes)

    def answered(self, plan: Plan, token_ids: Sequence[int]) -> None:
        """`plan`'s decode worker finished its request: `token_ids` is its prompt and answer. The
        answer's blocks are held there too (an agent loop's next prompt starts with them)."""
        request, block_size, prompt_hashes = plan.request, plan.block_size, plan.decision.block_hashes
        if block_size < 1:
            return
        parent = prompt_hashes[-1] if prompt_hashes else root_hash(request.model, request.cache_salt)
        answer_hashes = []
        for start in range(len(prompt_hashes) * block_size, len(token_ids) - block_size + 1, block_size):
            parent = chain_hash(parent, token_ids[start : start + block_size])
            answer_hashes.append(parent)
        self.index.vouch(plan.decode_worker, answer_hashes)

    def set_worker_state(self, worker_id: WorkerId, state: int) -> None:
        """A drain or undrain this replica made (the worker's next report says so too)."""
        entry = self.workers.get(worker_id)
        if entry is not None:
            entry.state = state
            self._changed.add(worker_id)

    def heard_at(self) -> float | None:
        """Until when reports demonstrably got through (the view's store_ok_at: core/health.py judges
        a worker silent against it): the store and the bus answered probes, and some worker's report
        arrived. An outage of the store, the bus or this replica's watch stops every report at once;
        none is then silent, and routing goes on with the last known loads."""
        if self.store_ok_at is None or self.last_report_at is None:
            return None
        return min(self.store_ok_at, self.last_report_at)

    def view(self) -> ClusterView:
        """Every worker as it last reported, and the cache index (the planner corrects the loads
        for what this replica routed since). Built from the last view: only workers whose entry
        changed since (a report, a drain, a new registration) get a new WorkerView and a new row
        in the view's columns (core/pool.py); a worker joining or leaving rebuilds it all.
        Rebuilding every worker's view cost ~20 us a worker on each request, 2.6 ms at 128
        workers (measured by `kvplane bench controlplane`), and even reusing them a pass over
        every worker per request, which a thousand workers notice."""
        last = self._last_view
        heard_at = self.heard_at()
        if last is None or self._membership_changed:
            workers = tuple(self._worker_view(worker_id, e) for worker_id, e in self.workers.items())
            view = ClusterView(workers, self.index, heard_at, table=WorkerTable(workers))
        elif self._changed:
            view = cluster_with(last, {w: self._worker_view(w, self.workers[w]) for w in self._changed}, heard_at)
        elif last.store_ok_at != heard_at:
            view = dataclasses.replace(last, store_ok_at=heard_at)  # the same workers and columns
        else:
            return last
        if self._stated_link is None:  # a registration changed since
            rates = sorted(e.info.link_gb_per_s for e in self.workers.values() if e.info.link_gb_per_s > 0)
            self._stated_link = rates[len(rates) // 2] * 1e9 if rates else 0.0
        if view.stated_link_bytes_per_s != self._stated_link:
            view = dataclasses.replace(view, stated_link_bytes_per_s=self._stated_link)
        self._last_view, self._changed, self._membership_changed = view, set(), False
        return view

    def _worker_view(self, worker_id: WorkerId, e: WorkerEntry) -> WorkerView:
        cached = self._views.get(worker_id)
        model = self.step_models.model_of(worker_id)
        if cached is not None and cached[0] is e and cached[1] == e.state and cached[2] == e.load_at and cached[3] is model:
            return cached[4]
        view = _worker_view(worker_id, e, model)
        self._views[worker_id] = (e, e.state, e.load_at, model, view)
        return view


def worker_kind(info: common_pb2.WorkerInfo) -> tuple:
    """What makes two workers run the same steps (core/step_pool.py): the served model, the KV
    layout, the prefill chunk and the hardware they say they run on."""
    return (info.model, info.layout.SerializeToString(deterministic=True), info.max_num_batched_tokens, info.hardware)


def _worker_view(worker_id: WorkerId, e: WorkerEntry, model: StepTimeModel | None) -> WorkerView:
    """`model`: the step-time model the worker is priced with (its kind's, core/step_pool.py)."""
    info, load = e.info, e.load
    return WorkerView(
        worker_id=worker_id,
        role=role_from_pb(info.role),
        model=info.model,
        block_size=info.layout.block_size,
        active=e.state != common_pb2.WORKER_STATE_DRAINING,
        load=WorkerLoadView(
            num_running=load.num_running,
            num_waiting=load.num_waiting,
            num_queued_prefill_tokens=load.num_queued_prefill_tokens,
            num_free_blocks=load.num_free_blocks,
            num_used_blocks=load.num_used_blocks,
            num_total_blocks=load.num_total_blocks,
            running_remaining_tokens=tuple(load.running_remaining_tokens),
            running_context_tokens=load.running_context_tokens,
        ),
        max_context=info.max_context,
        block_nbytes=layout_from_pb(info.layout).block_nbytes if info.layout.dtype else 0,
        latency=model,
        chunk_tokens=info.max_num_batched_tokens or DEFAULT_CHUNK_TOKENS,
        max_num_seqs=info.max_num_seqs,
        reported_at=e.load_at,
        transports=tuple(info.transports),
    )


def _log_if_it_died(task: asyncio.Task) -> None:
    """The view's tasks run as long as the replica: one that ends with an error stops what it keeps
    current, so say so at once (asyncio tells only when the task is collected, if ever)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s died, so what it keeps current no longer changes: %r", task.get_name(), task.exception(),
                  exc_info=task.exception())  # fmt: skip
