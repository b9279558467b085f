"""The bus (controlplane/bus/): what every backend delivers, what NATS retains and survives, and how
a replica's view applies bus messages to the registration they name. The in-process bus and the
embedded store need no process; the NATS tests run a real nats-server with JetStream on loopback."""

from __future__ import annotations

import asyncio

import pytest

from kvplane.controlplane import cluster_state as cs
from kvplane.controlplane import keys
from kvplane.controlplane.bus import BusUnavailable, MemoryBus, StoreBus, check_bus_url, open_bus
from kvplane.controlplane.cluster_state import ClusterState
from kvplane.controlplane.store import MemoryStore
from kvplane.types import Tier, WorkerId
from kvplane.v1 import common_pb2, registry_pb2
from tests.conftest import bus_messages

W = "w.1"  # a '.' is NATS's subject separator: the subject must not take the id as it is


def _batch(
    seq: int, hashes: list[bytes], *, lease: int = 0, snapshot: bool = False, worker: str = W
) -> registry_pb2.PublishKVEventsRequest:
    event = common_pb2.KVEvent(stored=common_pb2.BlockStored(block_hashes=hashes, tier=common_pb2.TIER_DEVICE))
    return registry_pb2.PublishKVEventsRequest(worker_id=worker, lease_id=lease, seq=seq, events=[event], snapshot=snapshot)


def _report(kv_seq: int, *, lease: int = 0, running: int = 0, worker: str = W) -> registry_pb2.ReportLoadRequest:
    load = common_pb2.WorkerLoad(num_running=running)
    return registry_pb2.ReportLoadRequest(worker_id=worker, lease_id=lease, kv_seq=kv_seq, load=load)


def _decoded(message) -> tuple:
    if message.kind == "load":
        report = registry_pb2.ReportLoadRequest.FromString(message.payload)
        return ("load", report.worker_id, report.load.num_running)
    batch = registry_pb2.PublishKVEventsRequest.FromString(message.payload)
    return ("kv", batch.worker_id, batch.seq)


async def _take(messages: asyncio.Queue, count: int, timeout_s: float = 20.0) -> list[tuple]:
    return [_decoded(await asyncio.wait_for(messages.get(), timeout_s)) for _ in range(count)]


# -- choosing a bus -----------------------------------------------------------------------------


def test_bus_urls_name_a_backend_and_auto_follows_the_store():
    assert check_bus_url("auto", "memory") == "memory"
    assert check_bus_url("auto", "etcd://127.0.0.1:2379") == "store"
    assert check_bus_url("store") == "store"
    assert check_bus_url("nats://a:4222,b:4222") == "nats"
    assert check_bus_url("tls://a:4222") == "nats"
    for bad in ("", "nats://", "kafka://a:9092", "etcd://a:2379"):
        with pytest.raises(ValueError, match="unsupported bus"):
            check_bus_url(bad)
    store = MemoryStore()
    assert isinstance(open_bus("auto", store), MemoryBus)
    assert isinstance(open_bus("auto", store, store_url="etcd://h:1"), StoreBus)


def test_a_nats_bus_that_cannot_be_reached_says_so_and_what_to_do():
    from kvplane.apps.cluster import free_port
    from kvplane.controlplane.bus.nats import NatsBus

    async def body():
        with pytest.raises(BusUnavailable, match=r"cannot reach NATS .*nats-server running with JetStream"):
            await NatsBus(f"nats://127.0.0.1:{free_port()}", timeout_s=0.5).start()

    asyncio.run(body())


# -- what every subscribable backend delivers ----------------------------------------------------


async def _deliver_in_order(bus) -> None:
    messages = await bus_messages(bus)
    for seq in (1, 2, 3):
        await bus.publish_kv(_batch(seq, [bytes([seq])], snapshot=seq == 1))
    await bus.publish_load(_report(3, running=5))
    await bus.publish_kv(_batch(1, [b"x"], worker="other", snapshot=True))
    got = await _take(messages, 5)
    assert [m for m in got if m[1] == W and m[0] == "kv"] == [("kv", W, 1), ("kv", W, 2), ("kv", W, 3)]
    assert ("load", W, 5) in got and ("kv", "other", 1) in got


def test_the_in_process_bus_delivers_every_message_in_order():
    async def body():
        bus = MemoryBus()
        await bus.start()
        await _deliver_in_order(bus)
        await bus.close()

    asyncio.run(body())


@pytest.mark.cluster
def test_nats_delivers_every_message_with_one_workers_batches_in_order(nats_factory):
    from kvplane.controlplane.bus.nats import NatsBus

    server = nats_factory()

    async def body():
        bus = NatsBus(server.url)
        await bus.start()
        await _deliver_in_order(bus)
        await bus.close()

    asyncio.run(body())


@pytest.mark.cluster
def test_nats_hands_load_reports_from_its_parser_to_the_replica_with_their_mac(nats_factory):
    """Load reports skip nats-py's message objects, queue and callback task (controlplane/bus/
    nats.py, _direct_client_class): if nats-py's internals change, this fails instead of every
    replica quietly paying the slow path."""
    from kvplane.bus import mac
    from kvplane.controlplane.bus.nats import NatsBus, carried_mac

    server = nats_factory()
    key = b"k" * 32

    async def body():
        publisher = NatsBus(server.url, mac_key=lambda kind, worker, lease: key)
        subscriber = NatsBus(server.url)
        await publisher.start()
        await subscriber.start()
        messages = await bus_messages(subscriber)
        load = subscriber._subscriptions["load"]
        assert set(subscriber._nc.direct) == {load._id}
        report = _report(0, running=4)
        await publisher.publish_load(report)
        message = await asyncio.wait_for(messages.get(), 10)
        assert (message.kind, message.payload) == ("load", report.SerializeToString())
        assert message.mac == mac(key, "load", message.payload)
        assert load._received == 0  # nats-py's own path (a Msg for the callback) never saw it
        await subscriber.close()
        assert subscriber._nc.direct == {}
        await publisher.close()

    asyncio.run(body())
    assert carried_mac(None) == carried_mac(b"NATS/1.0\r\n\r\n") == ""
    assert carried_mac(b"NATS/1.0\r\nOther: x\r\nKvplane-Mac: ab12\r\n\r\n") == "ab12"


@pytest.mark.cluster
def test_a_replica_reads_nats_in_windows_and_loses_nothing_meanwhile(nats_factory):
    """Once a read is parsed, the replica's NATS connection is not read for a window (controlplane/
    bus/nats.py, WindowedParser: what arrives meanwhile comes in one read), then read again; reports
    arriving one at a time through windows all arrive, in order."""
    from nats.aio.client import Client as Nats

    from kvplane import bus as wire
    from kvplane.controlplane.bus.nats import READ_WINDOW_S, NatsBus

    server = nats_factory()

    async def body():
        subscriber, publisher = NatsBus(server.url), Nats()  # an agent's plain client: its reads are not windowed
        await subscriber.start()
        await publisher.connect(servers=[server.url])
        loop = asyncio.get_running_loop()
        transport = subscriber._nc._transport._io_writer.transport
        reading_after_parse: list[bool] = []
        messages: asyncio.Queue = asyncio.Queue()

        def deliver(message) -> None:  # during the parse; the check runs once the parse returned
            loop.call_soon(lambda: reading_after_parse.append(transport.is_reading()))
            messages.put_nowait(message)

        await subscriber.subscribe(deliver)
        await publisher.publish(wire.subject("load", W), _report(0, running=1).SerializeToString())
        await asyncio.wait_for(messages.get(), 10)
        await asyncio.sleep(0)
        assert reading_after_parse == [False]
        await asyncio.sleep(2 * READ_WINDOW_S)
        assert transport.is_reading()
        for i in range(100):
            await publisher.publish(wire.subject("load", W), _report(0, running=i).SerializeToString())
            await publisher.flush()
            await asyncio.sleep(0.001)
        assert [_decoded(await asyncio.wait_for(messages.get(), 10))[2] for _ in range(100)] == list(range(100))
        assert subscriber._nc._ps.reads < 100, subscriber._nc._ps.reads  # (without windows, about one read each)
        await subscriber.close()
        await publisher.close()

    asyncio.run(body())


@pytest.mark.cluster
def test_a_nats_py_whose_internals_differ_still_delivers_reports_by_its_callbacks(nats_factory, monkeypatch):
    """The direct path overrides a private method of nats-py; another signature there means
    nats-py changed, and the bus falls back to its callbacks instead of guessing."""
    from nats.aio.client import Client

    from kvplane.controlplane.bus import nats as nats_bus

    original = Client._process_msg

    async def changed(self, sid, subject, reply, data, headers, extra=None):
        return await original(self, sid, subject, reply, data, headers)

    monkeypatch.setattr(Client, "_process_msg", changed)
    nats_bus._direct_client_class.cache_clear()
    server = nats_factory()

    async def body():
        publisher, subscriber = nats_bus.NatsBus(server.url), nats_bus.NatsBus(server.url)
        await publisher.start()
        await subscriber.start()
        assert type(subscriber._nc) is Client  # no direct path
        messages = await bus_messages(subscriber)
        await publisher.publish_load(_report(0, running=5))
        assert await _take(messages, 1) == [("load", W, 5)]
        await subscriber.close()
        await publisher.close()

    try:
        asyncio.run(body())
    finally:
        nats_bus._direct_client_class.cache_clear()


@pytest.mark.cluster
def test_a_report_its_subscriber_fails_on_leaves_the_next_arriving(nats_factory):
    """A load report's handler runs inside nats-py's parser: an exception there must not reset
    the connection (nor lose the reports after it)."""
    from kvplane.controlplane.bus.nats import NatsBus

    server = nats_factory()

    async def body():
        publisher, subscriber = NatsBus(server.url), NatsBus(server.url)
        await publisher.start()
        await subscriber.start()
        got: asyncio.Queue = asyncio.Queue()

        def deliver(message) -> None:
            if not got.qsize() and registry_pb2.ReportLoadRequest.FromString(message.payload).load.num_running == 1:
                got.put_nowait(None)
                raise RuntimeError("a broken subscriber")
            got.put_nowait(message)

        await subscriber.subscribe(deliver)
        await publisher.publish_load(_report(0, running=1))
        assert await asyncio.wait_for(got.get(), 10) is None
        await publisher.publish_load(_report(0, running=2))
        assert _decoded(await asyncio.wait_for(got.get(), 10)) == ("load", W, 2)
        assert subscriber._nc.is_connected
        await subscriber.close()
        await publisher.close()

    asyncio.run(body())


@pytest.mark.cluster
def test_nats_retains_the_latest_report_and_the_batches_since_the_snapshot_and_forgets_a_reregistered_worker(nats_factory):
    from kvplane.controlplane.bus.nats import NatsBus

    server = nats_factory()

    async def body():
        publisher = NatsBus(server.url, kv_compact_every_s=0.0)
        await publisher.start()
        for seq in range(1, 6):
            await publisher.publish_kv(_batch(seq, [bytes([seq])], snapshot=seq == 3))
        for running in (1, 2, 3):
            await publisher.publish_load(_report(5, running=running))
        late = NatsBus(server.url)  # a replica that starts now
        await late.start()
        got = await _take(await bus_messages(late), 4)
        assert got == [("kv", W, 3), ("kv", W, 4), ("kv", W, 5), ("load", W, 3)]
        await late.close()
        await publisher.forget_worker(W)  # the worker registers afresh
        await publisher.publish_kv(_batch(1, [b"n"], snapshot=True))
        later = NatsBus(server.url)
        await later.start()
        assert await _take(await bus_messages(later), 1) == [("kv", W, 1)]
        await later.close()
        await publisher.close()

    asyncio.run(body())


@pytest.mark.cluster
def test_a_replica_that_starts_reads_every_workers_latest_report_once_then_new_ones(nats_factory):
    """Load reports come by a plain subscription; a replica that subscribes first reads each
    worker's latest from the stream, in pulls of at most 1,024: 1,500 workers take two."""
    from kvplane.controlplane.bus.nats import NatsBus

    server = nats_factory()
    workers = [f"w{i}" for i in range(1500)]

    async def body():
        publisher = NatsBus(server.url)
        await publisher.start()
        for running in (1, 2):  # the stream keeps each worker's latest: running=2
            for worker in workers:
                await publisher.publish_load(_report(0, running=running, worker=worker))
        while (await publisher._js.stream_info("KVPLANE_LOAD")).state.last_seq < 2 * len(workers):
            await asyncio.sleep(0.05)  # the stream has them all: none reaches the late replica live
        late = NatsBus(server.url)
        await late.start()
        messages = await bus_messages(late)
        got = await _take(messages, len(workers))
        assert sorted(got) == sorted(("load", w, 2) for w in workers)
        await publisher.publish_load(_report(0, running=3, worker="w7"))
        assert await _take(messages, 1) == [("load", "w7", 3)]  # then by the subscription, once
        assert messages.empty()
        await late.close()
        await publisher.close()

    asyncio.run(body())


@pytest.mark.cluster
def test_a_snapshot_that_is_the_streams_first_message_is_kept(nats_factory):
    """nats-server reads a purge's seq 1 as no bound: purging "before" a snapshot at stream
    sequence 1 dropped the snapshot itself, and a replica that had not read it yet never did
    (seen as a flaky test_bus_tls). Both publishers, a replica's and an agent's, keep it."""
    from kvplane.controlplane.bus.nats import NatsBus
    from kvplane.dataplane.agent.bus_publish import BusPublisher
    from kvplane.security.credentials import Credentials

    async def first_snapshot_then_replay(publish) -> list[tuple]:
        server = nats_factory()
        replica = NatsBus(server.url, kv_compact_every_s=0.0)  # compacts at every snapshot
        await replica.start()
        await publish(server.url, replica)
        late = NatsBus(server.url)
        await late.start()
        try:
            return await _take(await bus_messages(late), 1, timeout_s=5)
        finally:
            await late.close()
            await replica.close()

    async def by_a_replica(url, replica):
        await replica.publish_kv(_batch(1, [b"a"], snapshot=True))

    async def by_an_agent(url, replica):
        agent = BusPublisher(url, Credentials(), W)
        assert await agent.start()
        assert await agent.publish_kv(_batch(1, [b"a"], snapshot=True), b"t" * 32)
        await agent.close()

    for publish in (by_a_replica, by_an_agent):
        assert asyncio.run(first_snapshot_then_replay(publish)) == [("kv", W, 1)], publish.__name__


@pytest.mark.cluster
def test_a_subscriber_gets_what_is_published_after_nats_is_killed_and_restarted(nats_factory):
    from kvplane.controlplane.bus.nats import NatsBus

    server = nats_factory()

    async def body():
        publisher, subscriber = NatsBus(server.url), NatsBus(server.url)
        await publisher.start()
        await subscriber.start()
        messages = await bus_messages(subscriber)
        await publisher.publish_kv(_batch(1, [b"a"], snapshot=True))
        assert await _take(messages, 1) == [("kv", W, 1)]
        server.kill()
        with pytest.raises(BusUnavailable, match="NATS did not confirm"):
            await publisher.publish_kv(_batch(2, [b"b"]))
        server.restart()
        for _ in range(100):  # the client reconnects on its own; until then publishing fails (the agent retries)
            try:
                await publisher.publish_kv(_batch(3, [b"c"]))
                break
            except BusUnavailable:
                await asyncio.sleep(0.2)
        # Batch 3, published after the restart, arrives. After a reconnect the subscriber replays
        # what the stream retains (batch 1 again, if the server wrote it before it was killed), and
        # batch 2, reported failed (the agent moves on to batch 3), may still come from the client's
        # reconnect buffer or not: then the replica sees 3 after 1, a gap it asks a snapshot for.
        seen = []
        while ("kv", W, 3) not in seen:
            seen += await _take(messages, 1)
        assert set(seen) <= {("kv", W, 1), ("kv", W, 2), ("kv", W, 3)}
        # Load reports too (a plain subscription, not the ordered consumer): one published now arrives.
        await publisher.publish_load(_report(3, running=7))
        while ("load", W, 7) not in seen:
            seen += await _take(messages, 1)
        await publisher.close()
        await subscriber.close()

    asyncio.run(body())


# -- a replica's view on a bus ----------------------------------------------------------------------


async def _settle(predicate, what: str) -> None:
    for _ in range(300):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _device_blocks(state: ClusterState, worker: str = W) -> int:
    return state.index.blocks_by_tier().get(WorkerId(worker), {}).get(Tier.DEVICE, 0)


async def _register(store: MemoryStore, worker: str = W) -> int:
    lease = await store.lease_grant(60)
    info = common_pb2.WorkerInfo(worker_id=worker, role=common_pb2.ROLE_BOTH, endpoint="h:1", model="m")
    await store.put(keys.worker_key(worker), info.SerializeToString(), lease=lease)
    return lease


def test_a_replica_that_starts_after_its_workers_registered_applies_their_bus_messages():
    """The registrations a replica lists at start carry their leases, as the watch's do: a replica
    restarted under a running fleet applied none of its workers' reports or batches (each named a
    lease the listing had left out, was held, and aged out; found by the chaos suite, seed 9 on
    nats-agents, after kill_replica)."""

    async def body():
        store, bus = MemoryStore(), MemoryBus()
        lease = await _register(store)  # before the replica starts
        state = ClusterState(store, bus=bus, credit_routed_only=False)
        await state.start()
        try:
            assert state.lease_of(W) == lease
            await bus.publish_kv(_batch(1, [b"a", b"b"], lease=lease, snapshot=True))
            await bus.publish_load(_report(1, lease=lease, running=3))
            await _settle(lambda: _device_blocks(state) == 2 and state.workers[WorkerId(W)].load.num_running == 3, "the messages")
            assert state.num_bus_held == 0 and state.bus_messages == {"load": 1, "kv": 1}
        finally:
            await state.stop()

    asyncio.run(body())


def test_bus_messages_apply_to_the_registration_they_name_and_wait_for_one_not_seen_yet():
    async def body():
        store, bus = MemoryStore(), MemoryBus()
        state = ClusterState(store, bus=bus, credit_routed_only=False)
        await state.start()
        try:
            # Published before the store shows the registration (another replica registered it):
            # held, then applied once the registration appears.
            lease = await store.lease_grant(60)
            await bus.publish_kv(_batch(1, [b"a", b"b"], lease=lease, snapshot=True))
            await bus.publish_load(_report(1, lease=lease, running=3))
            await asyncio.sleep(0.05)
            assert _device_blocks(state) == 0 and WorkerId(W) not in state.workers
            assert state.num_bus_held == 2 and state.bus_messages == {"load": 0, "kv": 0}
            info = common_pb2.WorkerInfo(worker_id=W, role=common_pb2.ROLE_BOTH, endpoint="h:1", model="m")
            await store.put(keys.worker_key(W), info.SerializeToString(), lease=lease)
            await _settle(lambda: _device_blocks(state) == 2, "the held snapshot")
            assert state.workers[WorkerId(W)].load.num_running == 3
            assert state.lease_of(W) == lease
            assert state.num_bus_held == 0 and state.bus_messages == {"load": 1, "kv": 1}
            # A message of an earlier registration (an old lease) changes nothing.
            await bus.publish_kv(_batch(2, [b"z"], lease=lease + 1))
            await bus.publish_load(_report(2, lease=lease + 1, running=9))
            await bus.publish_kv(_batch(2, [b"c"], lease=lease))
            await _settle(lambda: _device_blocks(state) == 3, "the next batch")
            assert state.workers[WorkerId(W)].load.num_running == 3
            assert not state.snapshot_requested(W)
            assert state.num_bus_held == 2 and state.bus_messages == {"load": 1, "kv": 2}  # the old lease's two wait, then age out
            assert not store_keys_under(store, keys.LOAD) and not store_keys_under(store, keys.KV)
        finally:
            await state.stop()

    asyncio.run(body())


def test_held_messages_age_out_though_no_other_registration_is_held(monkeypatch):
    """Dead leases' reports (a burst of lapsed registrations) are held; they go after
    PENDING_MAX_AGE_S at the next probe, not only when some other registration is held."""
    monkeypatch.setattr(cs, "STORE_PROBE_INTERVAL_S", 0.01)
    monkeypatch.setattr(cs, "PENDING_MAX_AGE_S", 0.2)

    async def body():
        store, bus = MemoryStore(), MemoryBus()
        state = ClusterState(store, bus=bus, credit_routed_only=False)
        await state.start()
        try:
            for lease in (101, 102):
                await bus.publish_load(_report(1, lease=lease, running=1))
            await _settle(lambda: state.num_bus_held == 2, "two held reports")
            await _settle(lambda: state.num_bus_held == 0, "the held reports to age out")
        finally:
            await state.stop()

    asyncio.run(body())


def store_keys_under(store: MemoryStore, prefix: str) -> list[str]:
    return [key for key in store._kvs if key.startswith(prefix)]


def test_a_first_batch_that_is_neither_batch_1_nor_a_snapshot_asks_for_a_snapshot():
    async def body():
        store, bus = MemoryStore(), MemoryBus()
        state = ClusterState(store, bus=bus)
        await state.start()
        try:
            lease = await _register(store)
            await _settle(lambda: WorkerId(W) in state.workers, "the registration")
            # The bus no longer had batches 1..6 (retention) when this replica subscribed.
            await bus.publish_kv(_batch(7, [b"g"], lease=lease))
            await _settle(lambda: state.snapshot_requested(W), "the snapshot request")
            assert (await store.get(keys.resync_key(W))) is not None
            await bus.publish_kv(_batch(8, [b"a", b"g"], lease=lease, snapshot=True))
            await _settle(lambda: not state.snapshot_requested(W), "the snapshot")
        finally:
            await state.stop()

    asyncio.run(body())


def test_on_an_unordered_bus_a_named_batch_is_lost_only_once_it_is_late(monkeypatch):
    monkeypatch.setattr(cs, "KV_LATE_S", 0.3)

    async def body():
        store, bus = MemoryStore(), MemoryBus()
        bus.ordered = False  # as NATS: load reports and batches travel in two streams
        state = ClusterState(store, bus=bus)
        await state.start()
        try:
            lease = await _register(store)
            await _settle(lambda: WorkerId(W) in state.workers, "the registration")
            await bus.publish_kv(_batch(1, [b"a"], lease=lease, snapshot=True))
            # A report overtakes batch 2: not a gap while the batch may still come...
            await bus.publish_load(_report(2, lease=lease))
            await bus.publish_kv(_batch(2, [b"b"], lease=lease))
            await bus.publish_load(_report(3, lease=lease))  # ...and again for batch 3, which never comes
            await asyncio.sleep(0.1)
            await bus.publish_load(_report(3, lease=lease))
            await asyncio.sleep(0.05)
            assert not state.snapshot_requested(W) and state.num_gaps_detected == 0
            await asyncio.sleep(0.3)
            await bus.publish_load(_report(3, lease=lease))  # still missing, now late: lost
            await _settle(lambda: state.snapshot_requested(W), "the snapshot request")
            assert state.num_gaps_detected == 1
        finally:
            await state.stop()

    asyncio.run(body())


# -- workers publishing on the bus themselves (--bus-for-agents) ----------------------------------


@pytest.mark.cluster
def test_with_workers_on_the_bus_only_messages_with_their_registrations_mac_apply_and_copies_change_nothing(nats_factory):
    """kvplane/bus.py's rule on a real nats-server: a worker's own report and KV batch (MAC keyed by
    its session token) apply; one without a MAC, with another worker's key or a copy of an applied
    one does not; nor does a batch of its own beyond what the registry takes from a call (a hash
    too long, too many hashes, more blocks than a worker may hold). What a replica publishes for a
    worker carries the MAC itself."""
    from nats.aio.client import Client as Nats

    from kvplane import bus as wire
    from kvplane.controlplane.batch_limits import BatchLimits
    from kvplane.controlplane.secrets import ClusterSecrets

    server = nats_factory()
    secrets = ClusterSecrets(b"s" * 32, b"k" * 32, b"c" * 32)

    async def body():
        store = MemoryStore()
        replica_bus = open_bus(server.url, store, mac_key=secrets.bus_key)
        await replica_bus.start()
        limits = BatchLimits(max_hashes=4, max_blocks=6)
        state = ClusterState(store, bus=replica_bus, credit_routed_only=False, bus_keys=secrets, batch_limits=limits)
        await state.start()
        worker = Nats()
        await worker.connect(servers=[server.url])
        try:
            lease, other = await _register(store), await _register(store, "w.2")
            await _settle(lambda: state.lease_of(W) == lease and state.lease_of("w.2") == other, "both registrations")
            token, other_token = secrets.session_token(W, lease), secrets.session_token("w.2", other)

            async def publish(kind: str, message, key: bytes | None) -> None:
                payload = message.SerializeToString()
                headers = {wire.MAC_HEADER: wire.mac(key, kind, payload)} if key is not None else None
                await worker.publish(wire.subject(kind, message.worker_id), payload, headers=headers)
                await worker.flush()

            def running() -> int:
                return state.workers[WorkerId(W)].load.num_running

            first = _report(0, lease=lease, running=3)
            first.report_seq = 1
            await publish("load", first, token)
            await _settle(lambda: running() == 3, "the worker's own report")
            forged = _report(0, lease=lease, running=50)
            forged.report_seq = 2
            # One at a time: the stream keeps a subject's latest report only, so one published right
            # after another may replace it before the replica reads it.
            refusals = [
                ("load", forged, None, "mac"),  # no MAC
                ("load", forged, other_token, "mac"),  # the other worker's key
                ("load", first, token, "replayed"),  # the applied report again, MAC and all
                ("kv", _batch(1, [b"a"], lease=lease, snapshot=True), other_token, "mac"),
                ("kv", _batch(1, [b"a" * 65], lease=lease, snapshot=True), token, "invalid"),  # a hash is 1..64 bytes
                ("kv", _batch(1, [b"a", b"b", b"c", b"d", b"e"], lease=lease, snapshot=True), token, "invalid"),  # 5 > 4 hashes
            ]
            for kind, message, key, reason in refusals:
                before = state.bus_rejected[reason]
                await publish(kind, message, key)
                await _settle(lambda reason=reason, before=before: state.bus_rejected[reason] == before + 1, f"a refusal ({reason})")
            assert state.bus_rejected == {"mac": 3, "replayed": 1, "invalid": 2}
            assert running() == 3 and _device_blocks(state) == 0
            # The worker's own batches, within the limits: 2 blocks, then 4 more (6, as many as it may hold) ...
            await publish("kv", _batch(1, [b"a", b"b"], lease=lease, snapshot=True), token)
            await publish("kv", _batch(2, [b"c", b"d", b"e", b"f"], lease=lease), token)
            await _settle(lambda: _device_blocks(state) == 6, "the worker's own batches")
            # ... and one more block is beyond what a worker may hold: the batch is dropped.
            await publish("kv", _batch(3, [b"g"], lease=lease), token)
            await _settle(lambda: state.bus_rejected["invalid"] == 3, "a batch beyond the blocks a worker may hold")
            assert _device_blocks(state) == 6
            # What a replica publishes for a worker (its gRPC report, its batch) carries the MAC itself.
            second = _report(0, lease=lease, running=7)
            second.report_seq = 2
            await replica_bus.publish_load(second)
            await replica_bus.publish_kv(_batch(4, [b"a", b"b"], lease=lease, snapshot=True))
            await _settle(lambda: running() == 7 and _device_blocks(state) == 2, "the replica's messages")
            assert state.bus_rejected == {"mac": 3, "replayed": 1, "invalid": 3}
        finally:
            await worker.close()
            await state.stop()
            await replica_bus.close()

    asyncio.run(body())
