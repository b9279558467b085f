"""The agent's link to the control plane: registration under a lease, keep-alive, load and KV events.

Keep-alive runs at a third of the lease TTL (etcd's Session recipe). Each load report carries the
worker's current step-time model; the profile the control plane stored for this worker (if any)
comes back with the registration and seeds that model. When the lease is gone
(the control plane says so, or the store lost it) the agent registers again and republishes a
full cache snapshot, so the index never misses what the agent holds.

Security: the link dials with the worker's credentials (its certificate, or the join token over
plaintext). Registration returns the control plane's ticket public key (the agent verifies tickets
with it) and a session token that every later call carries. No batch carries more than
KV_BATCH_MAX_HASHES block hashes: a bigger snapshot goes as a snapshot batch followed by plain
stored batches (the same content once applied), so it is never too large for the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import grpc

from dataplane.agent.config import AgentConfig
from dataplane.engines.events import AllCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvplane import tickets
from kvplane.convert import tier_to_pb
from kvplane.grpc_util import aio_channel
from kvplane.security.credentials import Credentials
from kvplane.security.limits import KV_BATCH_MAX_HASHES
from kvplane.types import BlockHash, Tier
from kvplane.v1 import common_pb2, registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)


def events_to_pb(events: list[KVCacheEvent]) -> list[common_pb2.KVEvent]:
    out = []
    for ev in events:
        if isinstance(ev, BlockStored):
            out.append(common_pb2.KVEvent(stored=common_pb2.BlockStored(block_hashes=list(ev.block_hashes), tier=tier_to_pb(ev.tier))))
        elif isinstance(ev, BlockRemoved):
            out.append(common_pb2.KVEvent(removed=common_pb2.BlockRemoved(block_hashes=list(ev.block_hashes), tier=tier_to_pb(ev.tier))))
        elif isinstance(ev, AllCleared):
            out.append(common_pb2.KVEvent(cleared=common_pb2.AllCleared()))
    return out


def snapshot_to_pb(hashes: Mapping[Tier, list[BlockHash]] | list[BlockHash]) -> list[common_pb2.KVEvent]:
    """One stored event per tier; a plain list means everything is on the device."""
    by_tier = hashes if isinstance(hashes, Mapping) else {Tier.DEVICE: hashes}
    return [
        common_pb2.KVEvent(stored=common_pb2.BlockStored(block_hashes=list(block_hashes), tier=tier_to_pb(tier)))
        for tier, block_hashes in by_tier.items()
        if block_hashes or tier is Tier.DEVICE
    ]


def _num_hashes(event: common_pb2.KVEvent) -> int:
    kind = event.WhichOneof("event")
    return len(event.stored.block_hashes) if kind == "stored" else len(event.removed.block_hashes) if kind == "removed" else 0


def split_batches(events: list[common_pb2.KVEvent], max_hashes: int = KV_BATCH_MAX_HASHES) -> list[list[common_pb2.KVEvent]]:
    """Events in order, cut into batches of at most `max_hashes` block hashes (a big event is cut too)."""
    batches: list[list[common_pb2.KVEvent]] = [[]]
    room = max_hashes
    for event in events:
        kind = event.WhichOneof("event")
        if kind not in ("stored", "removed"):
            batches[-1].append(event)
            continue
        part = getattr(event, kind)
        hashes = list(part.block_hashes)
        while True:
            if room == 0:
                batches.append([])
                room = max_hashes
            take, hashes = hashes[:room], hashes[room:]
            piece = common_pb2.KVEvent()
            getattr(piece, kind).tier = part.tier
            getattr(piece, kind).block_hashes.extend(take)
            batches[-1].append(piece)
            room -= len(take)
            if not hashes:
                break
    return batches


class LeaseLost(Exception):
    pass


class ControlPlaneLink:
    def __init__(
        self,
        config: AgentConfig,
        info: Callable[[], common_pb2.WorkerInfo],
        load: Callable[[], tuple[common_pb2.WorkerLoad, int]],
        take_events: Callable[[], list[KVCacheEvent]],
        snapshot: Callable[[], Mapping[Tier, list[BlockHash]] | list[BlockHash]],
        latency: Callable[[], common_pb2.LatencyModel | None] = lambda: None,
        on_profile: Callable[[common_pb2.LatencyProfile], None] = lambda profile: None,
        *,
        credentials: Credentials,
    ) -> None:
        self._config = config
        self._info = info
        self._load = load
        self._take_events = take_events
        self._snapshot = snapshot
        self._latency = latency
        self._on_profile = on_profile
        self._channel = aio_channel(config.controlplane, credentials)
        self._stub = registry_pb2_grpc.RegistryStub(self._channel)
        self.lease_id = 0
        self.ttl_s = 0
        self.session_token = b""
        self.verifier = tickets.TicketVerifier(b"")  # refuses every ticket until registered
        self._seq = 0
        self._registered = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._lock = asyncio.Lock()

    @property
    def worker_id(self) -> str:
        return self._config.worker_id

    async def start(self, timeout_s: float = 60.0) -> None:
        """Registers (retrying while the control plane is unreachable) and starts the loops."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await self._register()
                break
            except grpc.aio.AioRpcError as e:
                # ALREADY_EXISTS: our previous incarnation's lease is still alive; it ends within its TTL.
                retry = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ALREADY_EXISTS)
                if not retry or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"cannot register with the control plane at {self._config.controlplane}: {e.code().name}: {e.details()}"
                    ) from None
                if e.code() == grpc.StatusCode.ALREADY_EXISTS:
                    log.warning("%s; retrying", e.details())
                await asyncio.sleep(0.5)
        self._tasks = [
            asyncio.create_task(self._keepalive_loop(), name="keepalive"),
            asyncio.create_task(self._report_loop(), name="load-report"),
            asyncio.create_task(self._kv_loop(), name="kv-events"),
        ]

    async def stop(self, deregister: bool = True) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if deregister and self.lease_id:
            try:
                await self._stub.Deregister(
                    registry_pb2.DeregisterRequest(worker_id=self.worker_id, lease_id=self.lease_id, session_token=self.session_token),
                    timeout=2,
                )
            except grpc.aio.AioRpcError as e:
                log.warning("deregister failed (%s); the lease will expire on its own", e.details())
        await self._channel.close()

    async def _register(self) -> None:
        async with self._lock:
            reply = await self._stub.Register(
                registry_pb2.RegisterRequest(info=self._info(), ttl_seconds=self._config.lease_ttl_s), timeout=10
            )
            self.lease_id, self.ttl_s, self.session_token = reply.lease_id, reply.ttl_seconds, reply.session_token
            self.verifier = tickets.TicketVerifier(reply.ticket_public_key)
            if reply.HasField("profile") and reply.profile.samples:
                self._on_profile(reply.profile)
            # Everything the index knew is forgotten on registration: start with a snapshot.
            self._take_events()
            self._seq = 0
            await self._publish(snapshot_to_pb(self._snapshot()), snapshot=True)
            self._registered.set()
            log.info("registered as %s (lease %x, ttl %ds)", self.worker_id, self.lease_id, self.ttl_s)

    async def _reregister(self, why: str) -> None:
        log.warning("lease lost (%s); registering again", why)
        while True:
            try:
                await self._register()
                return
            except grpc.aio.AioRpcError as e:
                log.warning("re-registration failed: %s", e.details())
                await asyncio.sleep(1.0)

    async def _publish(self, events: list[common_pb2.KVEvent], snapshot: bool) -> None:
        """Publishes in batches the control plane accepts; a snapshot's first batch replaces the rest."""
        for number, batch in enumerate(split_batches(events)):
            self._seq += 1
            await self._stub.PublishKVEvents(
                registry_pb2.PublishKVEventsRequest(
                    worker_id=self.worker_id, lease_id=self.lease_id, seq=self._seq, events=batch,
                    snapshot=snapshot and number == 0, session_token=self.session_token,
                ),
                timeout=10,
            )  # fmt: skip

    async def _guarded(self, what: str, call) -> None:
        """Runs one loop step; a lost lease triggers re-registration, other failures are retried."""
        try:
            await call()
        except LeaseLost as e:
            await self._reregister(str(e))
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                await self._reregister(e.details())
            else:
                log.debug("%s failed: %s", what, e.details())

    async def _keepalive_loop(self) -> None:
        while True:
            await asyncio.sleep(max(self.ttl_s / 3, 0.5))

            async def step():
                reply = await self._stub.KeepAlive(
                    registry_pb2.KeepAliveRequest(worker_id=self.worker_id, lease_id=self.lease_id, session_token=self.session_token),
                    timeout=max(self.ttl_s / 3, 1),
                )
                if reply.ttl_seconds == 0:
                    raise LeaseLost("the store no longer has our lease")

            await self._guarded("keep-alive", step)

    async def _report_loop(self) -> None:
        while True:

            async def step():
                load, state = self._load()
                report = registry_pb2.ReportLoadRequest(
                    worker_id=self.worker_id, lease_id=self.lease_id, load=load, state=state, session_token=self.session_token
                )
                latency = self._latency()
                if latency is not None:
                    report.latency.CopyFrom(latency)
                await self._stub.ReportLoad(report, timeout=5)

            await self._guarded("load report", step)
            await asyncio.sleep(self._config.load_report_interval_s)

    async def _kv_loop(self) -> None:
        last_snapshot = time.monotonic()
        while True:
            await asyncio.sleep(self._config.kv_event_interval_s)

            async def step():
                nonlocal last_snapshot
                async with self._lock:
                    events = self._take_events()
                    due = time.monotonic() - last_snapshot >= self._config.kv_snapshot_interval_s
                    try:
                        if due:
                            # Taken after draining the events, so it includes them.
                            await self._publish(snapshot_to_pb(self._snapshot()), snapshot=True)
                            last_snapshot = time.monotonic()
                        elif events:
                            await self._publish(events_to_pb(events), snapshot=False)
                    except grpc.aio.AioRpcError:
                        # These events are gone: the next step sends a full snapshot instead.
                        last_snapshot = 0.0
                        raise

            await self._guarded("KV event publish", step)
