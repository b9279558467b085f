"""The agent's link to the control plane: registration under a lease, keep-alive, load and KV events.

Keep-alive runs at a third of the lease TTL (etcd's Session recipe). Each load report carries the
worker's current step-time model; the profile the control plane stored for this worker (if any)
comes back with the registration and seeds that model. When the lease is gone
(the control plane says so, or the store lost it) the agent registers again and republishes a
full cache snapshot, so the index never misses what the agent holds.

Replicas: `controlplane` may list several ("a:50051,b:50051"); a call that cannot reach its replica,
or times out there, moves every loop to the next one (the lease lives in the shared store, so any
replica renews it).

Load reports and keep-alives go on long-lived streams to the current replica (`ReportLoadStream`,
`KeepAliveStream`: a call each costs the control plane several times the CPU, call_stream.py); a
control plane without them (UNIMPLEMENTED) gets a call each.
When registration names the control plane's bus (`--bus-for-agents`), reports and KV batches are
published there instead (bus_publish.py), and through a replica only while the bus does not take them;
keep-alives are NATS requests there that one replica answers, and gRPC calls when none answers.

KV events are numbered batches. A replica that sees a gap in the numbers (a lost batch, a store
blip) asks for a snapshot; the answer to a load report carries the request (`snapshot_requested`)
and the next KV step publishes the whole cache instead of a batch. The periodic snapshot (every
`kv_snapshot_interval_s`) is skipped when it would repeat the last one published exactly, with no
batch since, for at most SNAPSHOT_REPEAT_MAX_S: an idle worker's snapshots cost the replica it
calls a call and a bus round trip and every replica a comparison with what it holds, 2-4 ms of a
replica each (docs/benchmarks.md). `drop_next_batch()` loses one
batch on purpose (fault injection, `kvplane agent --fault-injection`).

Security: the link dials with the worker's credentials (its certificate, or the join token over
plaintext). Registration returns the control plane's ticket public key (the agent verifies tickets
with it) and a session token that every later call carries. No batch carries more than
KV_BATCH_MAX_HASHES block hashes: a bigger snapshot goes as a snapshot batch followed by plain
stored batches (the same content once applied), so it is never too large for the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping

import grpc

from kvplane import tickets
from kvplane.call_stream import CallStream
from kvplane.convert import tier_to_pb
from kvplane.dataplane.agent.bus_publish import BusPublisher
from kvplane.dataplane.agent.config import AgentConfig
from kvplane.dataplane.agent.observe import record_lease_loss
from kvplane.dataplane.engines.events import AllCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvplane.errors import is_connection_failure
from kvplane.grpc_util import aio_channel
from kvplane.security.credentials import Credentials
from kvplane.security.limits import KV_BATCH_MAX_HASHES
from kvplane.types import BlockHash, Tier
from kvplane.v1 import common_pb2, registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)


KEEPALIVE_RETRY_S = 0.5  # after a failed keep-alive, while the lease may still be alive; doubled per failure in a row


def keepalive_pace(ttl_s: float) -> float:
    return max(ttl_s / 3, 0.5)


def bus_keepalive_timeout(ttl_s: float) -> float:
    """How long a keep-alive on the bus waits for a replica before the link asks over gRPC: short,
    so that the gRPC call still has its own third of the TTL."""
    return min(1.0, ttl_s / 6)


def next_keepalive_delay(ttl_s: float, *, failures: int, first_failure_after_move: bool, since_renewed_s: float) -> float:
    """How long the link waits before its next keep-alive, after `failures` failed in a row (0: the
    last one went through). A keep-alive may take a third of the TTL to time out, and the next at
    the pace would come another third later: one slow answer from a busy replica would let the
    lease lapse. So a failed one is tried again soon while the lease may still be alive (0.5 s,
    doubling per failure up to the pace, so that a fleet whose replicas are all down does not
    come back at them at once), and at once (once per failure streak) when the link moved to
    another replica; once the lease surely lapsed, at the pace."""
    pace = keepalive_pace(ttl_s)
    if failures == 0 or since_renewed_s >= ttl_s:
        return pace
    if first_failure_after_move:
        return 0.0
    return min(KEEPALIVE_RETRY_S * 2 ** (failures - 1), pace)


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


REPORT_TIMEOUT_S = 1.0
# An unchanged cache is published again at least this often all the same: well within what the bus
# retains (NATS keeps a worker's batches for an hour), and a repair for anything an index lost.
SNAPSHOT_REPEAT_MAX_S = 600.0
# A Register that takes longer is given up on (and, at start, tried on the next replica): the
# replica may have stored the registration and hung before replying.
REGISTER_TIMEOUT_S = 10.0
# What a first registration tries again (on the next replica, but ALREADY_EXISTS): ALREADY_EXISTS
# means our previous incarnation's lease is still alive, or the one a hung replica stored without
# replying (DEADLINE_EXCEEDED); it ends within its TTL.
# NOT_FOUND at start: the first snapshot reached a replica after the new lease had lapsed (a
# replica too busy to answer within the TTL, seen with 1,000 agents starting on 2 cores): register again.
_START_RETRIED = (
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.NOT_FOUND,
)  # fmt: skip


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
        self.endpoints = tuple(e.strip() for e in config.controlplane.split(","))
        self._credentials = credentials
        self._channels = [aio_channel(e, credentials) for e in self.endpoints]
        self._stubs = [registry_pb2_grpc.RegistryStub(c) for c in self._channels]
        self._current = 0  # the replica every loop talks to
        self.lease_id = 0
        self.ttl_s = 0
        self.session_token = b""
        self.verifier = tickets.TicketVerifier(b"")  # refuses every ticket until registered
        self._seq = 0
        self._registered = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._lock = asyncio.Lock()
        self._snapshot_due = False  # a replica asked for one (a gap in our KV event numbers)
        self._published_seq = 0  # the last batch the control plane acknowledged (what reports carry)
        self._drop_next_batch = False  # fault injection: lose the next batch
        # The last snapshot published: the batch number it ended at, a digest of it, when.
        self._snapshot_seq, self._snapshot_digest, self._snapshot_at = -1, b"", 0.0
        # Load reports and keep-alives each on one stream to the current replica (call_stream.py).
        self._reports = CallStream(
            "load report", lambda: self._stub.ReportLoadStream(), lambda r, t: self._stub.ReportLoad(r, timeout=t), lambda: REPORT_TIMEOUT_S
        )
        self._keepalives = CallStream(
            "keep-alive",
            lambda: self._stub.KeepAliveStream(),
            lambda r, t: self._stub.KeepAlive(r, timeout=t),
            lambda: max(self.ttl_s / 3, 1),
        )
        self._direct: BusPublisher | None = None  # load reports and KV batches straight to the bus (RegisterResponse.bus_url)
        self._report_seq = 0  # this registration's reports so far (ReportLoadRequest.report_seq)
        self._keepalive_seq = 0  # and its keep-alives sent on the bus (KeepAliveRequest.keepalive_seq)

    @property
    def _stub(self) -> registry_pb2_grpc.RegistryStub:
        return self._stubs[self._current]

    @property
    def endpoint(self) -> str:
        """The replica the link talks to now."""
        return self.endpoints[self._current]

    def _fail_over(self, e: grpc.aio.AioRpcError, tried: int) -> None:
        """A call to replica `tried` could not reach it, or it did not answer in time (a hung
        replica must not let the lease run out): the next calls go to the next one. Only away
        from the replica that failed: the loops share one replica, and a call that was already
        waiting on a hung one when another loop left it must not send every loop back there
        (with two replicas, that late timeout flipped the link back to the hung one until the
        lease ran out)."""
        if tried != self._current:
            return
        if len(self.endpoints) > 1 and (is_connection_failure(e) or e.code() == grpc.StatusCode.DEADLINE_EXCEEDED):
            self._current = (self._current + 1) % len(self.endpoints)
            log.warning("control plane unreachable (%s); switching to %s", e.details(), self.endpoint)

    def drop_next_batch(self) -> None:
        """Fault injection: the next KV event batch is numbered but never published."""
        self._drop_next_batch = True

    @property
    def worker_id(self) -> str:
        return self._config.worker_id

    async def start(self, timeout_s: float = 60.0) -> None:
        """Registers (retrying while the control plane is unreachable) and starts the loops."""
        deadline = time.monotonic() + timeout_s
        while True:
            tried = self._current
            try:
                await self._register()
                break
            except grpc.aio.AioRpcError as e:
                if e.code() not in _START_RETRIED or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"cannot register with the control plane at {self._config.controlplane}: {e.code().name}: {e.details()}"
                    ) from None
                if e.code() in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.NOT_FOUND):
                    log.warning("%s; retrying", e.details())
                else:
                    self._fail_over(e, tried)
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
        self._reports.end()
        self._keepalives.end()
        if self._direct is not None:
            await self._direct.close()
        if deregister and self.lease_id:
            try:
                await self._stub.Deregister(
                    registry_pb2.DeregisterRequest(worker_id=self.worker_id, lease_id=self.lease_id, session_token=self.session_token),
                    timeout=2,
                )
            except grpc.aio.AioRpcError as e:
                log.warning("deregister failed (%s); the lease will expire on its own", e.details())
        for channel in self._channels:
            await channel.close()

    async def _register(self, unless_not: int | None = None) -> None:
        """Registers under a new lease; `unless_not`: skip when the lease is no longer that one
        (another loop noticed the same loss and registered first)."""
        async with self._lock:
            if unless_not is not None and self.lease_id != unless_not:
                return
            reply = await self._stub.Register(
                registry_pb2.RegisterRequest(info=self._info(), ttl_seconds=self._config.lease_ttl_s), timeout=REGISTER_TIMEOUT_S
            )
            self.lease_id, self.ttl_s, self.session_token = reply.lease_id, reply.ttl_seconds, reply.session_token
            self._report_seq = self._keepalive_seq = 0
            self.verifier = tickets.TicketVerifier(reply.ticket_public_key)
            if reply.HasField("profile") and reply.profile.samples:
                self._on_profile(reply.profile)
            # Everything the index knew is forgotten on registration: start with a snapshot.
            self._take_events()
            self._seq = self._published_seq = 0
            await self._publish(snapshot_to_pb(self._snapshot()), snapshot=True)
            self._registered.set()
            log.info("registered as %s (lease %x, ttl %ds)", self.worker_id, self.lease_id, self.ttl_s)
            await self._use_bus(reply.bus_url)

    async def _reregister(self, why: str, lost_lease: int) -> None:
        """Registers again after `lost_lease` was lost, unless another loop already did."""
        log.warning("lease lost (%s); registering again", why)
        record_lease_loss()
        while True:
            tried = self._current
            try:
                await self._register(unless_not=lost_lease)
                return
            except grpc.aio.AioRpcError as e:
                log.warning("re-registration failed: %s", e.details())
                self._fail_over(e, tried)
                await asyncio.sleep(1.0)

    async def _publish(self, events: list[common_pb2.KVEvent], snapshot: bool, digest: bytes | None = None) -> None:
        """Publishes in batches the control plane accepts; a snapshot's first batch replaces the rest."""
        for number, events_in_batch in enumerate(split_batches(events)):
            self._seq += 1
            batch = registry_pb2.PublishKVEventsRequest(
                worker_id=self.worker_id, lease_id=self.lease_id, seq=self._seq, events=events_in_batch,
                snapshot=snapshot and number == 0,
            )  # fmt: skip
            if self._direct is None or not await self._direct.publish_kv(batch, self.session_token):
                batch.session_token = self.session_token
                await self._stub.PublishKVEvents(batch, timeout=10)
            # Only now: a report must never announce a batch the store may not hold yet.
            self._published_seq = self._seq
        if snapshot:
            digest = digest if digest is not None else _digest(events)  # `events`' digest, when the caller made it
            self._snapshot_seq, self._snapshot_digest, self._snapshot_at = self._seq, digest, time.monotonic()

    async def _guarded(self, what: str, call) -> bool:
        """Runs one loop step; a lost lease triggers re-registration, other failures are retried.
        Whether the step went through."""
        lease, tried = self.lease_id, self._current
        try:
            await call()
            return True
        except LeaseLost as e:
            await self._reregister(str(e), lease)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                await self._reregister(e.details(), lease)
            else:
                log.debug("%s failed: %s", what, e.details())
                self._fail_over(e, tried)
        return False

    async def _keepalive_loop(self) -> None:
        delay, failures, renewed_at = keepalive_pace(self.ttl_s), 0, time.monotonic()
        while True:
            await asyncio.sleep(delay)
            tried, lease = self._current, self.lease_id

            # The bus first (a gRPC call costs the replica several times the CPU), unless the last
            # keep-alive failed: the bus may have handed it to a hung replica, and its timeout
            # would come out of the little of the lease that is left.
            async def step(after_failure: bool = failures > 0):
                reply = None
                if self._direct is not None and not after_failure:
                    self._keepalive_seq += 1
                    request = registry_pb2.KeepAliveRequest(
                        worker_id=self.worker_id, lease_id=self.lease_id, keepalive_seq=self._keepalive_seq
                    )
                    reply = await self._direct.keep_alive(request, self.session_token, bus_keepalive_timeout(self.ttl_s))
                if reply is None:
                    reply = await self._keepalives.call(
                        registry_pb2.KeepAliveRequest(worker_id=self.worker_id, lease_id=self.lease_id, session_token=self.session_token),
                        self._current,
                    )
                if reply.ttl_seconds == 0:
                    raise LeaseLost("the store no longer has our lease")
                self._snapshot_asked(reply.snapshot_requested)

            ok = await self._guarded("keep-alive", step)
            moved = failures == 0 and self._current != tried
            if ok or self.lease_id != lease:  # renewed, or registered again
                failures, renewed_at = 0, time.monotonic()
            else:
                failures += 1
            delay = next_keepalive_delay(
                self.ttl_s, failures=failures, first_failure_after_move=moved, since_renewed_s=time.monotonic() - renewed_at
            )

    async def _report_loop(self) -> None:
        while True:

            async def step():
                load, state = self._load()
                load.sampled_at_unix_s = time.time()
                report = registry_pb2.ReportLoadRequest(
                    worker_id=self.worker_id,
                    lease_id=self.lease_id,
                    load=load,
                    state=state,
                    kv_seq=self._published_seq,
                )
                latency = self._latency()
                if latency is not None:
                    report.latency.CopyFrom(latency)
                self._report_seq += 1
                report.report_seq = self._report_seq
                if self._direct is not None and await self._direct.publish_load(report, self.session_token):
                    return  # snapshot requests come with keep-alives
                report.session_token = self.session_token
                reply = await self._reports.call(report, self._current)
                self._snapshot_asked(reply.snapshot_requested)

            await self._guarded("load report", step)
            await asyncio.sleep(self._config.load_report_interval_s)

    def _repeats_last_snapshot(self, digest: bytes) -> bool:
        """Whether the snapshot of `digest` is the last one published again: no batch since, the
        same content, and that one recent enough (SNAPSHOT_REPEAT_MAX_S)."""
        return (
            self._seq == self._snapshot_seq
            and time.monotonic() - self._snapshot_at < SNAPSHOT_REPEAT_MAX_S
            and digest == self._snapshot_digest
        )

    def _snapshot_asked(self, requested: bool) -> None:
        if requested and not self._snapshot_due:
            log.info("a control-plane replica asked for a KV snapshot (it saw a gap in our event numbers)")
            self._snapshot_due = True

    async def _use_bus(self, url: str) -> None:
        """Load reports and KV batches go to the bus at `url` from now on ("": through a replica), if it can be reached."""
        if self._direct is not None and self._direct.url == url:
            return
        if self._direct is not None:
            await self._direct.close()
            self._direct = None
        if url:
            direct = BusPublisher(url, self._credentials, self.worker_id)
            if await direct.start():
                self._direct = direct

    async def _kv_loop(self) -> None:
        last_snapshot = time.monotonic()
        while True:
            await asyncio.sleep(self._config.kv_event_interval_s)

            async def step():
                nonlocal last_snapshot
                async with self._lock:
                    events = self._take_events()
                    requested = self._snapshot_due
                    due = requested or time.monotonic() - last_snapshot >= self._config.kv_snapshot_interval_s
                    try:
                        if due:
                            # Taken after draining the events, so it includes them.
                            self._snapshot_due = False
                            snapshot = snapshot_to_pb(self._snapshot())
                            digest = _digest(snapshot)
                            if requested or not self._repeats_last_snapshot(digest):
                                await self._publish(snapshot, snapshot=True, digest=digest)
                            last_snapshot = time.monotonic()
                        elif events and self._drop_next_batch:
                            self._drop_next_batch = False
                            self._seq += 1  # numbered, acknowledged, lost: the replicas see a gap
                            self._published_seq = self._seq
                            log.warning("fault injection: dropped KV event batch %d (%d events)", self._seq, len(events))
                        elif events:
                            await self._publish(events_to_pb(events), snapshot=False)
                    except grpc.aio.AioRpcError:
                        # These events are gone: the next step sends a full snapshot instead.
                        last_snapshot = 0.0
                        raise

            await self._guarded("KV event publish", step)


def _digest(events: list[common_pb2.KVEvent]) -> bytes:
    return hashlib.blake2b(b"".join(e.SerializeToString() for e in events), digest_size=16).digest()
