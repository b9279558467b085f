"""Lease keep-alives that agents send on the NATS bus (`--bus-for-agents`) rather than as gRPC calls.

An agent renews its lease every third of the TTL: 300 renewals a second at 1,000 workers with
10 s leases. As gRPC calls on 1,000 connections they cost an idle replica about a quarter of its
CPU, most of it in gRPC's threads (docs/benchmarks.md); as NATS requests they arrive on the one
connection the load reports come by, and nats-py's parser hands them here.

One replica of the queue group (kvplane/bus.py) takes each keep-alive and does what KeepAlive does
with one: checks that the registration's worker sent it (its MAC, keyed by the session token only
that worker holds, stands in for the call's certificate and token), refuses a number it answered
already (a copy published again), renews the lease in the store, and answers the TTL and whether a
snapshot is wanted. Anything else is answered with an error (ERROR_HEADER) and the agent asks over
gRPC, whose answer says what to do (PERMISSION_DENIED, NOT_FOUND: register again, UNAVAILABLE:
another replica); nothing is decided here that the gRPC path would decide otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from google.protobuf.message import DecodeError

from kvplane.bus import mac_valid
from kvplane.controlplane.secrets import ClusterSecrets
from kvplane.controlplane.store.base import Store, StoreError
from kvplane.security.limits import clip
from kvplane.types import LeaseId
from kvplane.v1 import registry_pb2

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 60.0  # how often the numbers of leases gone quiet are forgotten
# What becomes of a keep-alive: renewed, lost (the lease had ended, TTL 0), or answered with an
# error (the agent asks over gRPC): mac, replayed, malformed, store; noreply: nobody to answer.
OUTCOMES = ("renewed", "lost", "mac", "replayed", "malformed", "store", "noreply")


class BusKeepAlives:
    def __init__(
        self,
        store: Store,
        secrets: ClusterSecrets,
        *,
        snapshot_requested: Callable[[str], bool],
        answer: Callable[[str, bytes, str], Awaitable[None]],
        max_ttl_s: float,
    ) -> None:
        self._store = store
        self._session_token = functools.lru_cache(maxsize=1 << 16)(secrets.session_token)  # (worker id, lease) -> MAC key
        self._snapshot_requested = snapshot_requested
        self._answer = answer  # (reply subject, KeepAliveResponse bytes, error) -> the bus's publish
        # lease -> (the last keepalive_seq answered here, when): a lease quiet for twice the longest
        # TTL has surely ended, and its entry goes at the next sweep.
        self._last: dict[int, tuple[int, float]] = {}
        self._quiet_after_s = 2 * max_ttl_s
        self._swept_at = time.monotonic()
        self._tasks: set[asyncio.Task] = set()  # renewals under way (the loop keeps only weak references)
        self.outcomes: Counter[str] = Counter(dict.fromkeys(OUTCOMES, 0))

    def handle(self, payload: bytes, carried_mac: str, reply: str) -> None:
        """One keep-alive from the bus (called from the NATS parser: it must not raise or block)."""
        if not reply:  # published, not requested: nobody would hear the answer
            self.outcomes["noreply"] += 1
            return
        task = asyncio.get_running_loop().create_task(self._renew(payload, carried_mac, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _renew(self, payload: bytes, carried_mac: str, reply: str) -> None:
        try:
            request = registry_pb2.KeepAliveRequest.FromString(payload)
        except DecodeError:
            return await self._refuse(reply, "malformed", "not a KeepAliveRequest")
        worker_id, lease, seq = request.worker_id, request.lease_id, request.keepalive_seq
        if not lease or not mac_valid(self._session_token(worker_id, lease), "keepalive", payload, carried_mac):
            return await self._refuse(reply, "mac", f"no valid MAC for worker {clip(worker_id)} and lease {lease:x}")
        now = time.monotonic()
        last = self._last.get(lease)
        if last is not None and seq <= last[0]:
            return await self._refuse(reply, "replayed", f"keep-alive {seq} of lease {lease:x} was answered already")
        self._last[lease] = (seq, now)
        if now - self._swept_at > SWEEP_EVERY_S:
            self._sweep(now)
        try:
            ttl = await self._store.lease_keepalive(LeaseId(lease))
        except StoreError as e:
            return await self._refuse(reply, "store", f"store unavailable: {e}")
        if ttl <= 0:
            self._last.pop(lease, None)
        self.outcomes["renewed" if ttl > 0 else "lost"] += 1
        response = registry_pb2.KeepAliveResponse(ttl_seconds=max(int(ttl), 0), snapshot_requested=self._snapshot_requested(worker_id))
        await self._send(reply, response.SerializeToString(), "")

    async def _refuse(self, reply: str, outcome: str, why: str) -> None:
        self.outcomes[outcome] += 1
        if self.outcomes[outcome] % 100 == 1:  # a flood logs one line in a hundred
            log.warning("refused a keep-alive from the bus (%s); %s so far", why, dict(self.outcomes))
        await self._send(reply, b"", why)

    async def _send(self, reply: str, payload: bytes, error: str) -> None:
        try:
            await self._answer(reply, payload, error)
        except Exception as e:  # the agent's request times out and it asks over gRPC
            log.debug("answering a keep-alive on the bus failed: %r", e)

    def _sweep(self, now: float) -> None:
        self._swept_at = now
        for lease in [lease for lease, (_, at) in self._last.items() if now - at > self._quiet_after_s]:
            del self._last[lease]

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
