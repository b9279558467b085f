"""NATS JetStream as the bus: the choice for several replicas, as Dynamo runs it.

Two streams, because the two kinds of message are kept differently (subjects: kvplane/bus.py):
  KVPLANE_LOAD  kvplane.load.<worker id, hex>  one message per subject: each worker's latest report
  KVPLANE_KV    kvplane.kv.<worker id, hex>    every KV batch; below a worker's snapshot purged (by
                                               the replica that published it, at most every
                                               `kv_compact_every_s`, or by the agent that did), the
                                               rest bounded by age and bytes
Every replica reads the KV
stream with an ordered consumer: ephemeral, flow-controlled and heartbeated, restarted by the
client at the next stream sequence after a gap, a reconnect or a server restart. Load reports,
of which only each worker's latest matters, come by a plain subscription to their subjects (the
stream still keeps the latest per worker, which a replica reads once when it subscribes). The two
arrive independently, so a load report may overtake the batch it names (`ordered` is False:
cluster_state.py waits a little before calling that a gap). Messages are handed to the
subscriber in nats-py's callback; beyond nats-py's pending limits it drops them (for a KV batch,
a gap: a snapshot is asked for). Load reports, 5,000 a second at 1,000 workers, skip nats-py's
message objects, header parsing, queue and task: its parser hands them to the replica directly
(_direct_client_class). The streams are created by the first replica to start, with
file storage, so a restarted nats-server with its storage directory loses nothing. Given `mac_key`,
every message published carries its MAC (kvplane/bus.py), and every message received hands it on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import ssl
from collections.abc import Callable

from kvplane.bus import ERROR_HEADER, KEEPALIVE_QUEUE, KV_STREAM, LOAD_STREAM, MAC_HEADER, mac, purge_before_snapshot, server_urls, subject
from kvplane.v1 import registry_pb2

from .base import BusMessage, BusUnavailable, PerWorkerThrottle

log = logging.getLogger(__name__)

STREAMS = {"load": LOAD_STREAM, "kv": KV_STREAM}
READ_WINDOW_S = 0.01  # a replica reads its NATS connection at most this often (WindowedParser)
_NO_HEADERS: dict[str, str] = {}


class NatsBus:
    name = "nats"
    carried_by_store = False
    ordered = False

    def __init__(
        self,
        url: str,
        *,
        tls: ssl.SSLContext | None = None,
        timeout_s: float = 2.0,
        kv_compact_every_s: float = 10.0,
        kv_max_age_s: float = 3600.0,
        kv_max_bytes: int = 1 << 30,
        replicas: int = 1,
        mac_key: Callable[[str, str, int], bytes] | None = None,
    ) -> None:
        self._servers = server_urls(url)
        self._mac_key = mac_key  # (kind, worker id, lease) -> the key of the MAC each message carries
        self._tls = tls
        self._timeout_s = timeout_s
        self._compaction = PerWorkerThrottle(kv_compact_every_s)
        self._kv_max_age_s = kv_max_age_s
        self._kv_max_bytes = kv_max_bytes
        self._replicas = replicas  # stream replicas in a NATS cluster
        self._nc = None
        self._js = None
        self._subscriptions: dict[str, object] = {}  # kind -> its subscription
        self._deliver: Callable[[BusMessage], None] | None = None  # the subscriber's
        self._resubscribing: asyncio.Task | None = None
        self._closing = False
        self._refused = False  # nats-server refused our certificate on some attempt (Authorization Violation)

    async def start(self) -> None:
        client = _direct_client_class()()
        try:
            # Bounded from outside too: a plaintext client at a TLS port waits on the server forever.
            await asyncio.wait_for(
                client.connect(
                    servers=self._servers, tls=self._tls, connect_timeout=self._timeout_s, allow_reconnect=True,
                    max_reconnect_attempts=2, reconnect_time_wait=0.5, error_cb=self._on_error,
                    disconnected_cb=self._on_disconnected, reconnected_cb=self._on_reconnected,
                ),
                4 * self._timeout_s + 2,
            )  # fmt: skip
            self._nc = client
        except Exception as e:
            self._closing = True
            with contextlib.suppress(Exception):
                await client.close()
            where = ", ".join(self._servers)
            if self._refused or _refused(e):
                raise BusUnavailable(
                    f"NATS at {where} refused this replica's certificate (Authorization Violation): nats-server maps client "
                    "certificates to users (verify_and_map) and none is this one's; list its URI SAN (spiffe://kvplane/controlplane/NAME) "
                    "in the server's authorization users (deploy/k8s/overlays/nats/nats.conf), or give --bus-cert the control plane's certificate"
                ) from e
            raise BusUnavailable(
                f"cannot reach NATS at {where} ({e!r}): is nats-server running with JetStream (-js), and do tls:// and --bus-ca/--bus-cert/--bus-key match its TLS settings? (or use --bus store)"
            ) from e
        self._nc.options["max_reconnect_attempts"] = -1  # connected once: from now on, reconnect for ever
        self._js = self._nc.jetstream(timeout=self._timeout_s)
        await self._ensure_streams()
        log.info("bus: NATS JetStream at %s", ", ".join(self._servers))

    async def _ensure_streams(self) -> None:
        from nats.js import api
        from nats.js.errors import BadRequestError

        day = 24 * 3600.0
        configs = [
            api.StreamConfig(
                name=LOAD_STREAM, subjects=["kvplane.load.*"], max_msgs_per_subject=1, max_age=day,
                storage=api.StorageType.FILE, discard=api.DiscardPolicy.OLD, num_replicas=self._replicas,
            ),
            api.StreamConfig(
                name=KV_STREAM, subjects=["kvplane.kv.*"], max_age=self._kv_max_age_s, max_bytes=self._kv_max_bytes,
                storage=api.StorageType.FILE, discard=api.DiscardPolicy.OLD, num_replicas=self._replicas,
            ),
        ]  # fmt: skip
        try:
            for config in configs:
                try:
                    await self._js.add_stream(config)
                except BadRequestError:  # it exists with other limits (another version, another flag): take ours
                    await self._js.update_stream(config)
        except Exception as e:
            raise BusUnavailable(f"cannot create the bus's JetStream streams ({e!r}): is JetStream on (nats-server -js)?") from e

    async def publish_load(self, report: registry_pb2.ReportLoadRequest) -> None:
        # Without waiting for JetStream's acknowledgement: the stream takes the message all the
        # same, a lost report is superseded by the next one 0.2 s later, and the round trip cost
        # more CPU than the rest of the report's handling.
        if not self._nc.is_connected:
            raise BusUnavailable("not connected to NATS (reconnecting); try again")
        payload = report.SerializeToString()
        try:
            await self._nc.publish(subject("load", report.worker_id), payload, headers=self._headers("load", report, payload))
        except Exception as e:
            raise BusUnavailable(f"NATS did not take a load report ({e!r}); try again") from e

    async def publish_kv(self, batch: registry_pb2.PublishKVEventsRequest) -> None:
        kv_subject, payload = subject("kv", batch.worker_id), batch.SerializeToString()
        ack = await self._publish(kv_subject, payload, KV_STREAM, self._headers("kv", batch, payload))
        if batch.snapshot:
            await self._maybe_compact(batch.worker_id, kv_subject, ack.seq)

    async def forget_worker(self, worker_id: str) -> None:
        for kind, stream in (("kv", KV_STREAM), ("load", LOAD_STREAM)):
            try:
                await self._js.purge_stream(stream, subject=subject(kind, worker_id))
            except Exception as e:
                raise BusUnavailable(f"NATS did not purge {worker_id}'s earlier messages ({e!r})") from e

    def _headers(self, kind: str, message, payload: bytes) -> dict[str, str] | None:
        if self._mac_key is None:
            return None
        return {MAC_HEADER: mac(self._mac_key(kind, message.worker_id, message.lease_id), kind, payload)}

    async def _publish(self, subj: str, payload: bytes, stream: str, headers: dict[str, str] | None):
        from nats.errors import NoRespondersError

        if not self._nc.is_connected:  # fail at once: the agent's call has a deadline of its own
            raise BusUnavailable("not connected to NATS (reconnecting); try again")
        try:
            try:
                return await self._js.publish(subj, payload, stream=stream, timeout=self._timeout_s, headers=headers)
            except NoRespondersError:
                # Nobody serves the stream: a nats-server restarted without its storage. Create it again, once.
                await self._ensure_streams()
                return await self._js.publish(subj, payload, stream=stream, timeout=self._timeout_s, headers=headers)
        except BusUnavailable:
            raise
        except Exception as e:
            raise BusUnavailable(f"NATS did not confirm a message for {stream} ({e!r}); try again") from e

    async def _maybe_compact(self, worker_id: str, kv_subject: str, snapshot_stream_seq: int) -> None:
        if not self._compaction.due(worker_id):
            return
        try:
            await purge_before_snapshot(self._js, kv_subject, snapshot_stream_seq)
        except Exception as e:  # the batches stay until age or size drops them: a replica replays more, nothing is lost
            log.warning("purging %s's KV batches before its snapshot failed: %r", worker_id, e)

    async def subscribe(self, deliver: Callable[[BusMessage], None]) -> None:
        if self._deliver is not None:
            raise RuntimeError("a NatsBus has one subscriber (the replica's view); open another bus for another")
        self._deliver = deliver
        # KV first: its retained batches come before the load reports that name them.
        for kind in ("kv", "load"):
            await self._subscribe(kind)

    async def _subscribe(self, kind: str) -> None:
        """KV batches: an ordered consumer of their stream from its start. Load reports: a plain
        subscription, then each worker's latest from the stream (_replay_latest_loads)."""
        from nats.js import api

        deliver = self._deliver
        assert deliver is not None

        async def receive(msg) -> None:  # nats-py's callback: KV batches, the replayed latest reports
            deliver(BusMessage(kind, msg.data, (msg.headers or _NO_HEADERS).get(MAC_HEADER, "")))

        def receive_report(data: bytes, headers: bytes | None, reply: bytes) -> None:
            deliver(BusMessage("load", data, carried_mac(headers)))

        try:
            if kind == "kv":
                self._subscriptions[kind] = await self._js.subscribe(
                    "kvplane.kv.*", stream=KV_STREAM, cb=receive, ordered_consumer=True, deliver_policy=api.DeliverPolicy.ALL,
                    idle_heartbeat=1.0,
                )  # fmt: skip
                return
            # No acknowledgement, flow control or sequence check per report, a fifth of reading
            # one (docs/benchmarks.md): only each worker's latest matters, and a report missed is
            # superseded by the next.
            subscription = self._subscriptions[kind] = await self._nc.subscribe("kvplane.load.*", cb=receive)
            direct = getattr(self._nc, "direct", None)
            if direct is not None:
                direct[subscription._id] = receive_report
        except Exception as e:
            raise BusUnavailable(f"cannot subscribe to {STREAMS[kind]} on NATS ({e!r})") from e
        try:
            await self._replay_latest_loads(receive)
        except Exception as e:  # the subscription brings every worker's next report all the same
            log.warning("reading the workers' latest load reports from %s failed (%r); waiting for their next", LOAD_STREAM, e)

    async def serve_keepalives(self, handle: Callable[[bytes, str, str], None]) -> None:
        """Agents' keep-alives (kvplane/bus.py): `handle(payload, mac, reply subject)` is called on
        the event loop with each one this replica is given, one replica of the queue group per
        message, and answers it with answer(). Straight from the parser where it can, as reports.
        A core subscription: nats-py restores it, and its sid, after a reconnect."""

        async def receive(msg) -> None:
            handle(msg.data, (msg.headers or _NO_HEADERS).get(MAC_HEADER, ""), msg.reply)

        def receive_direct(data: bytes, headers: bytes | None, reply: bytes) -> None:
            handle(data, carried_mac(headers), reply.decode())

        try:
            subscription = await self._nc.subscribe("kvplane.keepalive.*", queue=KEEPALIVE_QUEUE, cb=receive)
        except Exception as e:
            raise BusUnavailable(f"cannot subscribe to the agents' keep-alives on NATS ({e!r})") from e
        self._subscriptions["keepalive"] = subscription
        direct = getattr(self._nc, "direct", None)
        if direct is not None:
            direct[subscription._id] = receive_direct

    async def answer(self, reply: str, payload: bytes, error: str = "") -> None:
        """Answers a keep-alive at its reply subject: `payload` (a KeepAliveResponse), or `error`
        (the agent asks over gRPC instead). Without waiting: an answer lost is a keep-alive the
        agent sends again over gRPC."""
        await self._nc.publish(reply, payload, headers={ERROR_HEADER: error} if error else None)

    async def _replay_latest_loads(self, receive: Callable) -> None:
        """Each worker's latest report as the stream holds it now, read once (an ephemeral pull
        consumer), so that a replica that starts knows every worker's load at once instead of a
        report interval later. It stops at the first message published after it began (the
        subscription, opened before, brings those) or when none is left. While reports keep
        coming, nats-server 2.9 hands out some of them more than once (seen: one 659 times in
        1,500): each is passed on once. A report read twice anyway, or an older one after a newer,
        is dropped by its report_seq (cluster_state.py)."""
        from nats.errors import TimeoutError as NatsTimeoutError
        from nats.js import api

        last = (await self._js.stream_info(LOAD_STREAM)).state.last_seq
        if last == 0:
            return
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT, ack_policy=api.AckPolicy.NONE, inactive_threshold=60.0
        )
        pull = await self._js.pull_subscribe("kvplane.load.*", stream=LOAD_STREAM, config=config)
        try:
            seen: set[int] = set()
            budget = 2 * (await pull.consumer_info()).num_pending + 1024  # repeats included: a bound whatever the server does
            while budget > 0:
                try:
                    batch = await pull.fetch(1024, timeout=self._timeout_s)
                except NatsTimeoutError:
                    return
                for msg in batch:
                    budget -= 1
                    meta = msg.metadata
                    if meta.sequence.stream > last:
                        return
                    if meta.sequence.stream not in seen:
                        seen.add(meta.sequence.stream)
                        await receive(msg)
                    if meta.num_pending == 0:
                        return
        finally:
            await _unsubscribe(pull)
            with contextlib.suppress(Exception):
                await self._js.delete_consumer(LOAD_STREAM, config.name)  # pull_subscribe named it

    async def _resubscribe(self) -> None:
        """After a reconnect: new consumers that replay what the streams retain. The client's own
        ordered-consumer recovery can die when it runs while the connection is down, and a server
        that lost messages (killed before it wrote them) numbers new ones where the lost ones
        were, so resuming after the last sequence seen could skip them. A replay is harmless: a
        snapshot is the worker's whole truth and batches already applied are skipped (core/index.py).
        The load reports' subscription (which nats-py restores on its own) is dropped only once the
        new one is open, so no report falls between them; one read twice is dropped by its report_seq."""
        for kind in ("kv", "load"):
            old = self._subscriptions.pop(kind, None)
            if old is not None and kind == "kv":
                await _unsubscribe(old)
            while not self._closing:
                try:
                    await self._subscribe(kind)
                    break
                except BusUnavailable as e:
                    log.warning("NATS: %s; retrying", e)
                    await asyncio.sleep(0.5)
            if old is not None and kind == "load":
                await _unsubscribe(old)

    async def probe(self) -> None:
        if not self._nc.is_connected:
            raise BusUnavailable("not connected to NATS (reconnecting)")
        from nats.js.errors import NotFoundError

        try:
            await self._js.stream_info(LOAD_STREAM)
        except NotFoundError:  # a server that lost its storage: load reports (published unconfirmed) would vanish
            await self._ensure_streams()
        except Exception as e:
            raise BusUnavailable(f"JetStream did not answer ({e!r})") from e

    async def close(self) -> None:
        self._closing = True
        for sub in self._subscriptions.values():
            await _unsubscribe(sub)
        if self._nc is not None:
            await self._nc.close()

    async def _on_error(self, e: Exception) -> None:
        # start() names a refusal when connecting fails (nats-py then raises NoServersError, and the
        # last attempt's error may be a broken pipe rather than the refusal).
        self._refused = self._refused or _refused(e)
        # While reconnecting every failed attempt lands here; the disconnect was logged once.
        log.log(logging.DEBUG if self._nc is None or self._nc.is_reconnecting else logging.WARNING, "NATS: %r", e)

    async def _on_disconnected(self) -> None:
        if not self._closing:
            log.warning("NATS: disconnected; reconnecting")

    async def _on_reconnected(self) -> None:
        log.info("NATS: reconnected to %s", self._nc.connected_url.netloc if self._nc and self._nc.connected_url else "?")
        if self._deliver is not None and not self._closing and (self._resubscribing is None or self._resubscribing.done()):
            self._resubscribing = asyncio.get_running_loop().create_task(self._resubscribe(), name="nats-resubscribe")


async def _unsubscribe(subscription) -> None:
    direct = getattr(getattr(subscription, "_conn", None), "direct", None)  # a pull subscription has none
    if direct is not None:
        direct.pop(subscription._id, None)
    with contextlib.suppress(Exception):  # gone with the connection already
        await subscription.unsubscribe()


_MAC_LINE = b"\r\n" + MAC_HEADER.encode() + b": "


def carried_mac(headers: bytes | None) -> str:
    """The MAC header's value in a message's raw NATS headers ("NATS/1.0\\r\\nKvplane-Mac: ...\\r\\n\\r\\n";
    "" when it has none). A forged or repeated header can only make its own message fail the check."""
    if not headers:
        return ""
    start = headers.find(_MAC_LINE)
    if start < 0:
        return ""
    start += len(_MAC_LINE)
    end = headers.find(b"\r\n", start)
    return headers[start : end if end >= 0 else len(headers)].decode("ascii", "replace").strip()


@functools.cache
def _direct_client_class():
    """nats-py's Client, but a message of a subscription in its `direct` (sid -> function) goes
    from the parser straight to that function: no Msg, header dict, queue or task, 7-8 of 17-20 µs
    of a replica's CPU per load report (a throwaway reader of 4,400 reports a second). It overrides
    nats-py's private `Client._process_msg`, whose signature is checked here; tests/controlplane/
    test_bus.py fails if reports stop arriving this way."""
    from nats.aio.client import Client  # the optional dependency, loaded only for this bus

    if list(inspect.signature(Client._process_msg).parameters) != ["self", "sid", "subject", "reply", "data", "headers"]:
        log.warning("this nats-py's Client._process_msg is not the one kvplane knows; load reports take its callbacks")
        return Client

    class DirectClient(Client):
        def __init__(self) -> None:
            super().__init__()
            self.direct: dict[int, Callable[[bytes, bytes | None, bytes], None]] = {}  # (payload, raw headers, reply subject)
            self._ps = WindowedParser(self, self._ps, READ_WINDOW_S)

        async def _process_msg(self, sid, subject, reply, data, headers) -> None:
            handler = self.direct.get(sid)
            if handler is None:
                return await super()._process_msg(sid, subject, reply, data, headers)
            try:
                handler(data, headers, reply)
            except Exception:  # raised into nats-py's parser, it would reset the connection
                log.exception("a message from the bus (%s) could not be handed on", subject)

    return DirectClient


class WindowedParser:
    """nats-py's parser (`Client._ps`, which its read loop hands each read to), then a pause: the
    connection is not read for `window_s` after each read is parsed, so what arrives meanwhile
    waits in the socket and comes in one read. Reports from 1,000 workers arrive a few at a time,
    5,000 a second, and each read cost the event loop a wakeup, a syscall and a turn of the read
    loop; reads at most every 10 ms cost a report at most 10 ms of its 200 ms interval
    (docs/benchmarks.md). Everything else of the parser's is nats-py's."""

    def __init__(self, client, parser, window_s: float) -> None:
        self._client = client
        self._parser = parser
        self._window_s = window_s
        self.reads = 0

    async def parse(self, data: bytes) -> None:
        self.reads += 1
        await self._parser.parse(data)
        # nats-py's TcpTransport over asyncio streams (TLS too); another transport is read as it comes.
        transport = getattr(getattr(getattr(self._client, "_transport", None), "_io_writer", None), "transport", None)
        if transport is None or transport.is_closing() or not transport.is_reading():  # (paused by the stream's flow control)
            return
        transport.pause_reading()
        try:
            await asyncio.sleep(self._window_s)
        finally:
            if not transport.is_closing():
                transport.resume_reading()

    def __getattr__(self, name: str):
        return getattr(self._parser, name)


def _refused(e: BaseException) -> bool:
    """nats-server refused the connection's credentials (no user maps to its certificate)."""
    return "authorization violation" in str(e).lower()
