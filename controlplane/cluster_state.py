"""Each replica's view of the cluster, rebuilt from the store alone: list, then watch.

Workers, their latest load and the cache index all come from keys under /kvplane/. A worker's
keys live under its lease, so when the lease expires (the agent died) the store deletes them and
the worker-key delete removes it from routing and from the index, with nobody calling it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controlplane import keys
from controlplane.core.index import CacheIndex, ClearedEvent, RemovedEvent, StoredEvent
from controlplane.core.settings import ClusterSettings
from controlplane.core.views import DEFAULT_CHUNK_TOKENS, ClusterView, WorkerLoadView, WorkerView
from controlplane.store.base import EventType, Store, WatchEvent
from kvplane.convert import layout_from_pb, role_from_pb, tier_from_pb
from kvplane.latency import StepTimeModel
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


class ClusterState:
    def __init__(self, store: Store) -> None:
        self._store = store
        self.workers: dict[WorkerId, WorkerEntry] = {}
        self.index = CacheIndex()
        self.settings = ClusterSettings()
        self._watch_task: asyncio.Task | None = None
        self._synced = asyncio.Event()
        self.revision = 0
        # Listeners (the planner): blocks a worker reported stored, a load report's arrival (with its
        # monotonic time), workers gone.
        self.kv_stored_listeners: list[Callable[[WorkerId, Sequence[BlockHash]], None]] = []
        self.load_reported_listeners: list[Callable[[WorkerId, float], None]] = []
        self.worker_removed_listeners: list[Callable[[WorkerId], None]] = []

    async def start(self) -> None:
        items, revision = await self._store.get_prefix(keys.ROOT)
        # Workers first so load and KV keys of a known worker attach to it.
        for kv in sorted(items, key=lambda kv: not kv.key.startswith(keys.WORKERS)):
            self._apply(WatchEvent(EventType.PUT, kv.key, kv.value, kv.mod_revision))
        self.revision = revision
        self._watch_task = asyncio.create_task(self._watch(revision + 1), name="cluster-watch")
        self._synced.set()

    async def stop(self) -> None:
        if self._watch_task:
            self._watch_task.cancel()
            try:
                await self._watch_task
            except (asyncio.CancelledError, Exception):
                pass

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
            except Exception as e:  # a broken watch must not leave a stale view: resume where it stopped
                log.warning("store watch failed (%s); resuming from revision %d", e, start_revision)
                await asyncio.sleep(0.5)

    # -- applying store events -------------------------------------------------------------

    def _apply(self, event: WatchEvent) -> None:
        key = event.key
        try:
            if key.startswith(keys.WORKERS):
                self._apply_worker(WorkerId(key[len(keys.WORKERS) :]), event)
            elif key.startswith(keys.LOAD) and event.type is EventType.PUT:
                self._apply_load(WorkerId(key[len(keys.LOAD) :]), event.value)
            elif key.startswith(keys.KV) and event.type is EventType.PUT:
                self._apply_kv(key, event.value)
            elif key.startswith(keys.SETTINGS):
                self._apply_setting(key[len(keys.SETTINGS) :], event)
        except Exception:
            log.exception("ignoring malformed store entry %s", key)

    def _apply_worker(self, worker_id: WorkerId, event: WatchEvent) -> None:
        if event.type is EventType.DELETE:
            self.workers.pop(worker_id, None)
            self.index.remove_worker(worker_id)
            for listener in self.worker_removed_listeners:
                listener(worker_id)
            log.info("worker %s left (lease expired or deregistered)", worker_id)
            return
        info = common_pb2.WorkerInfo.FromString(event.value)
        old = self.workers.get(worker_id)
        if old is not None and old.info == info:
            return  # the same worker registered again; its next snapshot refreshes the index
        if old is not None:
            # A different incarnation: its cache starts from the snapshot it publishes next.
            self.index.remove_worker(worker_id)
        self.workers[worker_id] = WorkerEntry(info=info, load=common_pb2.WorkerLoad(), state=info.state, load_at=time.monotonic())
        log.info("worker %s joined: %s at %s", worker_id, common_pb2.Role.Name(info.role), info.endpoint)

    def _apply_load(self, worker_id: WorkerId, value: bytes) -> None:
        entry = self.workers.get(worker_id)
        if entry is None:
            return
        report = registry_pb2.ReportLoadRequest.FromString(value)
        entry.load = report.load
        entry.state = report.state or entry.state
        entry.load_at = time.monotonic()
        if report.HasField("latency"):
            entry.latency = StepTimeModel.from_pb(report.latency)
        for listener in self.load_reported_listeners:
            listener(worker_id, entry.load_at)

    def _apply_kv(self, key: str, value: bytes) -> None:
        worker_id, seq = keys.parse_kv_key(key)
        batch = registry_pb2.PublishKVEventsRequest.FromString(value)
        events = events_from_pb(batch.events)
        if batch.snapshot:
            by_tier: dict[Tier, list[BlockHash]] = {}
            for ev in events:
                if isinstance(ev, StoredEvent):
                    by_tier.setdefault(ev.tier, []).extend(ev.block_hashes)
            self.index.apply_snapshot(WorkerId(worker_id), seq, by_tier)
        else:
            self.index.apply_batch(WorkerId(worker_id), seq, events)
        for ev in events:
            if isinstance(ev, StoredEvent):
                for listener in self.kv_stored_listeners:
                    listener(WorkerId(worker_id), ev.block_hashes)

    def _apply_setting(self, name: str, event: WatchEvent) -> None:
        values = dict(self.settings.values)
        if event.type is EventType.DELETE:
            values.pop(name, None)
        else:
            values[name] = event.value.decode()
        self.settings = ClusterSettings(values)
        log.info("setting %s = %r", name, values.get(name))

    # -- the view the planner plans on ----------------------------------------------------------

    def view(self) -> ClusterView:
        """Every worker as it last reported, and the cache index (the planner corrects the loads
        for what this replica routed since)."""
        return ClusterView(tuple(_worker_view(worker_id, e) for worker_id, e in self.workers.items()), self.index)


def _worker_view(worker_id: WorkerId, e: WorkerEntry) -> WorkerView:
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
        latency=e.latency,
        chunk_tokens=info.max_num_batched_tokens or DEFAULT_CHUNK_TOKENS,
        max_num_seqs=info.max_num_seqs,
        transports=tuple(info.transports),
    )
