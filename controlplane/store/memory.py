"""Embedded in-memory store: the single-machine default, with etcd's semantics (see base.py).

- One global revision, starting at 1 like an empty etcd; a write that changes nothing (deleting a
  missing key) does not advance it.
- Watch history keeps the last `max_history_events` events; dropping an event raises the
  compaction floor past its revision, so a watch that asks for it gets StoreCompacted instead of
  a silent gap.
- A lease expires `ttl` seconds after its last grant/renewal (event-loop clock). A timer fires at
  the deadline, and every operation also expires overdue leases first, so a late timer never lets
  a caller see a dead lease's keys. Expiry deletes the keys in sorted order in one revision, as
  etcd's lessor does.
A MemoryStore belongs to the event loop that first uses its leases; it is not thread-safe.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import secrets
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from kvplane.types import LeaseId

from .base import (
    Compare,
    Delete,
    EventType,
    KeyValue,
    LeaseNotFound,
    Op,
    Put,
    StoreCompacted,
    StoreError,
    WatchEvent,
    check_ops,
    check_start_revision,
    check_ttl,
    compacted_message,
    compare_holds,
)

DEFAULT_MAX_HISTORY_EVENTS = 100_000

_CLOSED = object()  # queued to every watcher when the store closes


@dataclass(slots=True)
class _Lease:
    ttl: int
    deadline: float
    keys: set[str] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True, eq=False)
class _Watcher:
    prefix: str
    start_revision: int
    queue: asyncio.Queue


class MemoryStore:
    def __init__(self, max_history_events: int = DEFAULT_MAX_HISTORY_EVENTS) -> None:
        if max_history_events < 1:
            raise ValueError(f"max_history_events must be >= 1, got {max_history_events}")
        self._max_history_events = max_history_events
        self._revision = 1
        self._compact_floor = 1  # watches may start at this revision or later
        self._kvs: dict[str, KeyValue] = {}
        self._sorted_keys: list[str] = []
        self._history: deque[WatchEvent] = deque()
        self._leases: dict[LeaseId, _Lease] = {}
        # Random start, like etcd: a restarted store never hands out a lease id an agent still holds.
        self._lease_ids = itertools.count(secrets.randbits(48) + 1)
        self._watchers: set[_Watcher] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def num_active_watches(self) -> int:
        return len(self._watchers)

    # ---- reads -------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        self._begin()
        return self._kvs.get(key)

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        self._begin()
        return [self._kvs[k] for k in self._keys_with_prefix(prefix)], self._revision

    # ---- writes ------------------------------------------------------------------------

    async def put(self, key: str, value: bytes, lease: LeaseId | None = None) -> int:
        self._begin()
        return self._apply([Put(key, value, lease)])

    async def delete(self, key: str) -> bool:
        self._begin()
        before = self._revision
        return self._apply([Delete(key)]) != before

    async def delete_prefix(self, prefix: str) -> int:
        self._begin()
        num_keys = len(self._keys_with_prefix(prefix))
        self._apply([Delete(prefix, prefix=True)])
        return num_keys

    async def transaction(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> bool:
        check_ops(success)
        check_ops(failure)
        self._begin()
        succeeded = all(compare_holds(c, self._kvs.get(c.key)) for c in compare)
        self._apply(success if succeeded else failure)
        return succeeded

    async def compact(self, revision: int) -> None:
        self._begin()
        if revision > self._revision:
            raise ValueError(f"cannot compact to revision {revision}: the store is only at revision {self._revision}")
        while self._history and self._history[0].mod_revision < revision:
            self._history.popleft()
        self._compact_floor = max(self._compact_floor, revision)

    # ---- watch -------------------------------------------------------------------------

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> AsyncGenerator[WatchEvent, None]:
        check_start_revision(start_revision)
        return self._watch(prefix, start_revision)

    async def _watch(self, prefix: str, start_revision: int | None) -> AsyncGenerator[WatchEvent, None]:
        if self._closed:
            return
        self._expire_due()
        start = self._revision + 1 if start_revision is None else start_revision
        if start < self._compact_floor:
            raise StoreCompacted(compacted_message(prefix, start, self._compact_floor), self._compact_floor)
        watcher = _Watcher(prefix, start, asyncio.Queue())
        # Replay and registration happen with no await in between, so no write can fall in a gap.
        for event in self._history_since(start):
            if event.key.startswith(prefix):
                watcher.queue.put_nowait(event)
        self._watchers.add(watcher)
        try:
            while True:
                item = await watcher.queue.get()
                if item is _CLOSED:
                    return
                yield item
        finally:
            self._watchers.discard(watcher)

    # ---- leases ------------------------------------------------------------------------

    async def lease_grant(self, ttl_seconds: int) -> LeaseId:
        check_ttl(ttl_seconds)
        self._begin()
        loop = self._bind_loop()
        lease_id = LeaseId(next(self._lease_ids))
        lease = _Lease(ttl=ttl_seconds, deadline=loop.time() + ttl_seconds)
        self._leases[lease_id] = lease
        self._arm(lease_id, lease)
        return lease_id

    async def lease_keepalive(self, lease: LeaseId) -> int:
        self._begin()
        state = self._leases.get(lease)
        if state is None:
            return 0
        state.deadline = self._bind_loop().time() + state.ttl
        self._arm(lease, state)
        return state.ttl

    async def lease_revoke(self, lease: LeaseId) -> None:
        self._begin()
        if lease in self._leases:
            self._end_lease(lease)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for lease in self._leases.values():
            if lease.timer is not None:
                lease.timer.cancel()
        for watcher in self._watchers:
            watcher.queue.put_nowait(_CLOSED)

    # ---- internals ---------------------------------------------------------------------

    def _begin(self) -> None:
        if self._closed:
            raise StoreError("the memory store is closed; open a new one with open_store('memory://')")
        self._expire_due()

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise StoreError("a MemoryStore with leases can only be used from the event loop that created them")
        return loop

    def _keys_with_prefix(self, prefix: str) -> list[str]:
        start = bisect.bisect_left(self._sorted_keys, prefix)
        keys = []
        for key in itertools.islice(self._sorted_keys, start, None):
            if not key.startswith(prefix):
                break
            keys.append(key)
        return keys

    def _history_since(self, revision: int) -> list[WatchEvent]:
        events = []
        for event in reversed(self._history):
            if event.mod_revision < revision:
                break
            events.append(event)
        events.reverse()
        return events

    def _apply(self, ops: Sequence[Op]) -> int:
        """Apply ops as one revision; returns the store revision afterwards."""
        for op in ops:
            if isinstance(op, Put) and op.lease is not None and op.lease not in self._leases:
                raise LeaseNotFound(
                    f"lease {op.lease} not found (expired or revoked) while putting {op.key!r}; grant a new lease and put the key again"
                )
        revision = self._revision + 1
        events: list[WatchEvent] = []
        for op in ops:
            if isinstance(op, Put):
                events.append(self._put_one(op, revision))
            elif op.prefix:
                events.extend(self._delete_one(k, revision) for k in self._keys_with_prefix(op.key))
            elif op.key in self._kvs:
                events.append(self._delete_one(op.key, revision))
        if events:
            self._revision = revision
            self._publish(events)
        return self._revision

    def _put_one(self, op: Put, revision: int) -> WatchEvent:
        old = self._kvs.get(op.key)
        if old is None:
            bisect.insort(self._sorted_keys, op.key)
            create_revision, version = revision, 1
        else:
            create_revision, version = old.create_revision, old.version + 1
            if old.lease is not None and old.lease != op.lease and old.lease in self._leases:
                self._leases[old.lease].keys.discard(op.key)
        if op.lease is not None:
            self._leases[op.lease].keys.add(op.key)
        self._kvs[op.key] = KeyValue(op.key, op.value, create_revision, revision, version, op.lease)
        return WatchEvent(EventType.PUT, op.key, op.value, revision, op.lease)

    def _delete_one(self, key: str, revision: int) -> WatchEvent:
        old = self._kvs.pop(key)
        del self._sorted_keys[bisect.bisect_left(self._sorted_keys, key)]
        if old.lease is not None and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        return WatchEvent(EventType.DELETE, key, b"", revision)

    def _publish(self, events: list[WatchEvent]) -> None:
        for event in events:
            self._history.append(event)
        while len(self._history) > self._max_history_events:
            dropped = self._history.popleft()
            self._compact_floor = max(self._compact_floor, dropped.mod_revision + 1)
        for watcher in self._watchers:
            for event in events:
                if event.mod_revision >= watcher.start_revision and event.key.startswith(watcher.prefix):
                    watcher.queue.put_nowait(event)

    def _arm(self, lease_id: LeaseId, lease: _Lease) -> None:
        if lease.timer is not None:
            lease.timer.cancel()
        lease.timer = self._bind_loop().call_at(lease.deadline, self._on_timer, lease_id)

    def _on_timer(self, lease_id: LeaseId) -> None:
        lease = self._leases.get(lease_id)
        if lease is None or self._closed:
            return
        lease.timer = None
        if lease.deadline <= self._bind_loop().time():
            self._end_lease(lease_id)
        else:  # the loop may fire a timer a clock tick early
            self._arm(lease_id, lease)

    def _expire_due(self) -> None:
        if self._loop is None or not self._leases:
            return
        now = self._loop.time()
        for lease_id in [i for i, lease in self._leases.items() if lease.deadline <= now]:
            self._end_lease(lease_id)

    def _end_lease(self, lease_id: LeaseId) -> None:
        lease = self._leases.pop(lease_id)
        if lease.timer is not None:
            lease.timer.cancel()
        self._apply([Delete(key) for key in sorted(lease.keys)])
