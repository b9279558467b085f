"""The bus seam: how workers' load reports and KV event batches reach every replica.

These are the control plane's high-rate messages (a report per worker every 0.2 s, a batch per
cache change); what needs consensus (membership and leases, settings, drains, keys) stays in the
store. A replica that serves an agent's call publishes it; every replica (the publisher too)
applies what the bus delivers, so a replica's view does not depend on which replica an agent
talks to.

What every backend guarantees:
- A subscriber first gets what the bus retains (each worker's latest load report, and its KV
  batches since its latest snapshot, as far as retention allows), then every later message.
- One worker's KV batches arrive in the order they were published. `ordered` says whether a load
  report also arrives after every batch published before it (the store and the in-process bus:
  yes; NATS, where they travel in two streams: no).
- A message may be missed (retention, a bus outage): the KV batches' own sequence numbers show it,
  and the replica asks the worker for a snapshot (controlplane/cluster_state.py).
- Messages carry the worker's lease: a replica applies them only to that registration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from kvplane.v1 import registry_pb2

Kind = Literal["load", "kv"]


class BusError(RuntimeError):
    """A bus operation failed; the message says what to do about it."""


class BusUnavailable(BusError):
    """The bus could not be reached or did not confirm a message."""


@dataclass(frozen=True, slots=True)
class BusMessage:
    kind: Kind
    payload: bytes  # a serialized ReportLoadRequest ("load") or PublishKVEventsRequest ("kv"), without the session token
    mac: str = ""  # kvplane/bus.py's MAC, where the bus carries one (NATS)


@dataclass(slots=True)
class PerWorkerThrottle:
    """Whether a worker's periodic chore (dropping KV batches older than its snapshot) is due: at
    most once every `interval_s` per worker."""

    interval_s: float
    _last: dict[str, float] = field(default_factory=dict)

    def due(self, worker_id: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(worker_id, float("-inf")) < self.interval_s:
            return False
        self._last[worker_id] = now
        return True


class Bus(Protocol):
    name: str  # for logs and metrics: "store", "memory" or "nats"
    # True: the messages are keys in the store and the replica's store watch delivers them
    # (nobody subscribes).
    carried_by_store: bool
    ordered: bool  # a load report arrives after every KV batch its worker published before it

    async def start(self) -> None: ...

    async def publish_load(self, report: registry_pb2.ReportLoadRequest) -> None:
        """Raises BusUnavailable when the bus did not take it (and LeaseNotFound through the store bus)."""
        ...

    async def publish_kv(self, batch: registry_pb2.PublishKVEventsRequest) -> None:
        """A snapshot batch also lets the bus drop the worker's earlier batches."""
        ...

    async def forget_worker(self, worker_id: str) -> None:
        """The worker registers afresh: its earlier KV batches are of no use to anyone."""
        ...

    async def subscribe(self, deliver: Callable[[BusMessage], None]) -> None:
        """Subscribes now: `deliver` is called on the event loop with each retained message, then
        with each new one, until close(); one subscriber per bus. A call, not a queue: nats-py's message
        objects, queue and task took 7-8 of a replica's 17-20 µs per report (5,000 a second at 1,000 workers;
        docs/benchmarks.md), which NATS now skips for load reports (controlplane/bus/nats.py)."""
        ...

    async def probe(self) -> None:
        """Returns when the bus answers; raises BusUnavailable when it does not (the replica then
        does not judge workers silent: a bus outage stops every report at once)."""
        ...

    async def close(self) -> None: ...
