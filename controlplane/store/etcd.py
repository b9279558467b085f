"""etcd v3 backend, through the maintained asyncio client `aetcd` (1.0.0).

Why aetcd: the `etcd3` package on PyPI is unmaintained and its generated stubs break under
protobuf >= 4; aetcd works with protobuf 7 and grpc.aio.

aetcd's own watch helper multiplexes every watch over one stream and can hang when the start
revision is compacted, so each `watch_prefix` here opens its own Watch stream on aetcd's channel
(its generated stubs): cancelling that one gRPC call releases exactly that watch, and close()
cancels them all first so it never waits on a watcher.

etcd's own security: with `tls` (kvplane.security.Credentials) the channel is TLS against etcd's
CA, presenting a client certificate when given (with etcd's --client-cert-auth and auth enabled,
the certificate's CN is the etcd user); `username`/`password` use etcd's password auth. aetcd
opens only plaintext channels, so `_TlsClient` opens a secure one in its place.

Lease keep-alives share a few long-lived LeaseKeepAlive streams per member (`_KeepAlives`), as
etcd's own client keeps one: aetcd's `refresh_lease` opens a new stream per call, and a replica
renews every worker's lease (one call per worker every third of its TTL).

Every gRPC failure becomes a StoreError; an unreachable server (UNAVAILABLE, deadline) becomes
StoreUnavailable, with the endpoint in the message.

Several members (`etcd://h1:2379,h2:2379,h3:2379`, as Kubernetes' --etcd-servers): calls go to
one member; one that cannot be reached, or has no leader, sends the call (and every later one)
to the next member, each member tried once per call within the call's timeout. Leases, watches
and transactions are the cluster's, so any member serves them: a watch is opened with etcd's
"require leader" metadata, so a member cut off from the quorum ends it instead of going quiet,
and the caller re-opens it (from its last revision) on the next member. A transaction retried on
another member after a lost answer may apply twice; kvplane's are idempotent (create-if-absent,
register = delete + put of the same keys).
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncGenerator, Sequence

import aetcd
import grpc
from aetcd import rpc

from kvplane.types import LeaseId

from .base import (
    Compare,
    EventType,
    KeyValue,
    LeaseNotFound,
    Op,
    Put,
    StoreCompacted,
    StoreError,
    StoreUnavailable,
    WatchEvent,
    check_ops,
    check_start_revision,
    check_ttl,
    compacted_message,
)

DEFAULT_TIMEOUT_S = 5.0

_TARGET_TO_PROTO = {
    "value": rpc.Compare.VALUE,
    "version": rpc.Compare.VERSION,
    "mod_revision": rpc.Compare.MOD,
    "create_revision": rpc.Compare.CREATE,
}
_OP_TO_PROTO = {
    "==": rpc.Compare.EQUAL,
    "!=": rpc.Compare.NOT_EQUAL,
    "<": rpc.Compare.LESS,
    ">": rpc.Compare.GREATER,
}
_RPC_TO_STUB = {
    "Range": "kvstub",
    "Put": "kvstub",
    "DeleteRange": "kvstub",
    "Txn": "kvstub",
    "Compact": "kvstub",
    "LeaseGrant": "leasestub",
    "LeaseRevoke": "leasestub",
}
_UNAVAILABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_NO_LEADER = "no leader"  # etcdserver: no leader (a member cut off from its quorum)


def _range_for_prefix(prefix: str) -> tuple[bytes, bytes]:
    """etcd's [key, range_end) for "every key starting with prefix"."""
    start = prefix.encode()
    end = bytearray(start)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return start, bytes(end[: i + 1])
    # Empty prefix (or all 0xff bytes): range_end "\0" means "to the end of the keyspace".
    return start or b"\0", b"\0"


def _to_key_value(kv) -> KeyValue:
    return KeyValue(
        key=kv.key.decode(),
        value=bytes(kv.value),
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        version=kv.version,
        lease=LeaseId(kv.lease) if kv.lease else None,
    )


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _TlsClient(aetcd.Client):
    """aetcd's client over a TLS channel (aetcd itself only dials plaintext)."""

    def __init__(self, *args, channel_credentials: grpc.ChannelCredentials, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._channel_credentials = channel_credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        original = rpc.insecure_channel
        credentials = self._channel_credentials

        def secure(target, options=None):
            rpc.insecure_channel = original  # restored at once: aetcd dials synchronously, before its first await
            return rpc.secure_channel(target, credentials, options=options)

        rpc.insecure_channel = secure
        try:
            await super().connect()
        finally:
            rpc.insecure_channel = original


# A watch on a member without a leader is cancelled instead of silently delivering nothing.
_REQUIRE_LEADER = (("hasleader", "true"),)


class EtcdStore:
    def __init__(
        self, members: Sequence[tuple[str, int]], timeout_s: float = DEFAULT_TIMEOUT_S, *, tls=None,
        username: str | None = None, password: str | None = None,
    ) -> None:  # fmt: skip
        if not members:
            raise ValueError("an etcd store needs at least one member (host, port)")
        self._endpoints: list[str] = []
        self._clients: list[aetcd.Client] = []
        auth = {"username": username, "password": password} if username else {}
        channel_credentials = tls.channel_credentials() if tls is not None and tls.tls else None
        for host, port in members:
            # aetcd joins host and port with ":", so an IPv6 literal needs its brackets back.
            client_host = f"[{host}]" if ":" in host else host
            self._endpoints.append(f"{client_host}:{port}")
            if channel_credentials is not None:
                client = _TlsClient(host=client_host, port=port, timeout=timeout_s, channel_credentials=channel_credentials, **auth)
            else:
                client = aetcd.Client(host=client_host, port=port, timeout=timeout_s, **auth)
            self._clients.append(client)
        self._current = 0  # the member calls go to
        self._timeout_s = timeout_s
        # Each member gets a share of a call's time, so that one hung member leaves time for the others.
        self._attempt_timeout_s = max(timeout_s / len(members), min(timeout_s, 1.0))
        self._watch_calls: set = set()
        self._keepalives = {id(client): _KeepAlives(client, endpoint) for client, endpoint in zip(self._clients, self._endpoints)}
        self._closed = False

    @property
    def endpoint(self) -> str:
        """Every member, comma-separated."""
        return ",".join(self._endpoints)

    @property
    def current_endpoint(self) -> str:
        """The member calls go to now."""
        return self._endpoints[self._current]

    def _fail_over(self, member: int) -> None:
        """Member `member` failed: later calls go to the next one (unless another call moved on already)."""
        if member == self._current and len(self._clients) > 1:
            self._current = (member + 1) % len(self._clients)

    @property
    def num_active_watches(self) -> int:
        return len(self._watch_calls)

    # ---- reads -------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        response = await self._call("get", "Range", rpc.RangeRequest(key=key.encode()))
        return _to_key_value(response.kvs[0]) if response.kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        start, end = _range_for_prefix(prefix)
        response = await self._call("get_prefix", "Range", rpc.RangeRequest(key=start, range_end=end))
        return [_to_key_value(kv) for kv in response.kvs], response.header.revision

    # ---- writes ------------------------------------------------------------------------

    async def put(self, key: str, value: bytes, lease: LeaseId | None = None) -> int:
        response = await self._call("put", "Put", self._op_proto(Put(key, value, lease)).request_put)
        return response.header.revision

    async def delete(self, key: str) -> bool:
        response = await self._call("delete", "DeleteRange", rpc.DeleteRangeRequest(key=key.encode()))
        return response.deleted > 0

    async def delete_prefix(self, prefix: str) -> int:
        start, end = _range_for_prefix(prefix)
        response = await self._call("delete_prefix", "DeleteRange", rpc.DeleteRangeRequest(key=start, range_end=end))
        return response.deleted

    async def transaction(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> bool:
        check_ops(success)
        check_ops(failure)
        request = rpc.TxnRequest(
            compare=[self._compare_proto(c) for c in compare],
            success=[self._op_proto(op) for op in success],
            failure=[self._op_proto(op) for op in failure],
        )
        response = await self._call("transaction", "Txn", request)
        return response.succeeded

    async def compact(self, revision: int) -> None:
        try:
            await self._call("compact", "Compact", rpc.CompactionRequest(revision=revision))
        except StoreError as err:
            detail = str(err)
            if "future revision" in detail:
                raise ValueError(f"cannot compact etcd at {self.endpoint} to revision {revision}: it is in the future") from None
            if "has been compacted" not in detail:  # compacting again is a no-op, as in memory
                raise

    # ---- watch -------------------------------------------------------------------------

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> AsyncGenerator[WatchEvent, None]:
        check_start_revision(start_revision)
        return self._watch(prefix, start_revision)

    async def _watch(self, prefix: str, start_revision: int | None) -> AsyncGenerator[WatchEvent, None]:
        if self._closed:
            return
        member = self._current
        await self._connect(f"watch of {prefix!r}", member)
        if self._closed:
            return
        client, endpoint = self._clients[member], self._endpoints[member]
        key, range_end = _range_for_prefix(prefix)
        create = rpc.WatchCreateRequest(key=key, range_end=range_end, start_revision=start_revision or 0)
        call = rpc.WatchStub(client.channel).Watch(metadata=(*(client.metadata or ()), *_REQUIRE_LEADER))
        self._watch_calls.add(call)
        try:
            try:
                await call.write(rpc.WatchRequest(create_request=create))
                while True:
                    response = await call.read()
                    if response is grpc.aio.EOF:
                        if self._closed:
                            return
                        self._fail_over(member)
                        raise StoreUnavailable(f"etcd at {endpoint} ended the watch of {prefix!r}; re-list and watch again")
                    if response.compact_revision:
                        rev = response.compact_revision
                        raise StoreCompacted(compacted_message(prefix, start_revision or 0, rev), rev)
                    if response.canceled:
                        self._fail_over(member)
                        raise StoreUnavailable(f"etcd at {endpoint} cancelled the watch of {prefix!r}: {response.cancel_reason}")
                    for event in response.events:
                        is_put = event.type == rpc.Event.PUT
                        yield WatchEvent(
                            EventType.PUT if is_put else EventType.DELETE,
                            event.kv.key.decode(),
                            bytes(event.kv.value) if is_put else b"",
                            event.kv.mod_revision,
                            LeaseId(event.kv.lease) if is_put and event.kv.lease else None,
                        )
            except asyncio.CancelledError:
                # close() cancels the gRPC call, which surfaces here as CancelledError; that is a
                # clean end of iteration, unlike a cancellation of the consuming task.
                if self._closed and not _being_cancelled():
                    return
                raise
            except StoreError:
                raise
            except Exception as err:
                if self._closed:
                    return
                self._fail_over(member)
                raise self._translate(err, f"watch of {prefix!r}", member) from err
        finally:
            self._watch_calls.discard(call)
            call.cancel()

    # ---- leases ------------------------------------------------------------------------

    async def lease_grant(self, ttl_seconds: int) -> LeaseId:
        check_ttl(ttl_seconds)
        response = await self._call("lease_grant", "LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl_seconds))
        return LeaseId(response.ID)

    async def lease_keepalive(self, lease: LeaseId) -> int:
        reply = await self._on_members("lease_keepalive", lambda client: self._keepalives[id(client)].renew(lease))
        return reply.TTL if reply is not None else 0  # etcd answers TTL 0 for a dead lease

    async def lease_revoke(self, lease: LeaseId) -> None:
        try:
            await self._call("lease_revoke", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease))
        except LeaseNotFound:
            pass  # already expired or revoked: the outcome the caller wanted

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for call in list(self._watch_calls):
            call.cancel()
        for keepalives in self._keepalives.values():
            keepalives.close()
        for client in self._clients:
            await client.close()

    # ---- internals ---------------------------------------------------------------------

    async def _connect(self, what: str, member: int) -> None:
        if self._closed:
            raise StoreError(f"the etcd store for {self.endpoint} is closed; open a new one with open_store()")
        try:
            await self._clients[member].connect()
        except Exception as err:
            self._fail_over(member)
            raise self._translate(err, what, member) from err

    async def _on_members(self, what: str, operation):
        """`operation(client)` on the current member, then on each other one that it could not reach."""
        failures: list[StoreUnavailable] = []
        for _ in range(len(self._clients)):
            member = self._current
            try:
                await self._connect(what, member)
                return await asyncio.wait_for(operation(self._clients[member]), self._attempt_timeout_s)
            except StoreUnavailable as err:
                failures.append(err)
            except Exception as err:
                translated = self._translate(err, what, member)
                if not isinstance(translated, StoreUnavailable):
                    raise translated from err
                self._fail_over(member)
                failures.append(translated)
        if len(failures) == 1:
            raise failures[0]
        raise StoreUnavailable(f"no etcd member answered ({what}): " + "; ".join(str(f) for f in failures))

    async def _call(self, what: str, rpc_name: str, request):
        """One unary RPC with error translation, failing over between members."""

        def call(client: aetcd.Client):
            method = getattr(getattr(client, _RPC_TO_STUB[rpc_name]), rpc_name)
            return method(request, timeout=self._attempt_timeout_s, metadata=client.metadata)

        return await self._on_members(what, call)

    @staticmethod
    def _compare_proto(compare: Compare):
        proto = rpc.Compare(
            key=compare.key.encode(),
            target=_TARGET_TO_PROTO[compare.target],
            result=_OP_TO_PROTO[compare.op],
        )
        setattr(proto, compare.target, compare.operand)  # the proto fields carry our target names
        return proto

    @staticmethod
    def _op_proto(op: Op):
        if isinstance(op, Put):
            return rpc.RequestOp(request_put=rpc.PutRequest(key=op.key.encode(), value=op.value, lease=op.lease or 0))
        if op.prefix:
            start, end = _range_for_prefix(op.key)
            return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=start, range_end=end))
        return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=op.key.encode()))

    def _translate(self, err: BaseException, what: str, member: int) -> StoreError:
        endpoint = self._endpoints[member]
        if isinstance(err, StoreError):
            return err
        rpc_err = err if isinstance(err, grpc.aio.AioRpcError) else err.__cause__
        if isinstance(rpc_err, grpc.aio.AioRpcError):
            code, detail = rpc_err.code(), rpc_err.details()
        else:
            code, detail = None, str(err) or type(err).__name__
        unreachable = (aetcd.exceptions.ConnectionFailedError, aetcd.exceptions.ConnectionTimeoutError, TimeoutError)
        if code in _UNAVAILABLE_CODES or isinstance(err, unreachable) or _NO_LEADER in (detail or ""):
            return StoreUnavailable(f"etcd at {endpoint} is unavailable ({what}): {detail}; check that etcd is running and reachable")
        if code == grpc.StatusCode.NOT_FOUND and "lease not found" in detail:
            return LeaseNotFound(
                f"etcd at {endpoint}: lease not found (expired or revoked) during {what}; grant a new lease and write the keys again"
            )
        return StoreError(f"etcd at {endpoint} failed {what}: {detail}")


KEEPALIVE_STREAMS = 4  # per member at most; each has one write in flight, so they renew in parallel


class _KeepAlives:
    """Lease renewals on one member over a few long-lived LeaseKeepAlive streams. A renewal goes
    to the stream with the fewest waiting to be written; another stream is opened (up to
    KEEPALIVE_STREAMS) only when every open one has renewals waiting behind its write: a write
    takes a turn of the event loop, so one stream alone renews too few leases a second on a busy
    replica. A stream that fails or ends fails the renewals waiting on it and is dropped; the next
    renewal opens another."""

    def __init__(self, client: aetcd.Client, endpoint: str) -> None:
        self.client = client
        self._endpoint = endpoint
        self.streams: list[_KeepAliveStream] = []

    def renew(self, lease: LeaseId) -> asyncio.Future:
        """A future of etcd's LeaseKeepAliveResponse (TTL 0: the lease is gone). A future, not a
        coroutine: awaited under a timeout, a coroutine would cost a task per renewal."""
        if any(s.ended for s in self.streams):
            self.streams = [s for s in self.streams if not s.ended]
        stream = min(self.streams, key=_KeepAliveStream.backlog, default=None)
        if stream is None or (stream.backlog() and len(self.streams) < KEEPALIVE_STREAMS):
            stream = _KeepAliveStream(self.client, self._endpoint)  # (EtcdStore._on_members connected the client)
            self.streams.append(stream)
        waiter = stream.renew(lease)
        waiter.add_done_callback(functools.partial(stream.forget, lease))  # answered, failed, timed out or cancelled
        return waiter

    def close(self) -> None:
        for stream in self.streams:
            stream.end()
        self.streams = []


class _KeepAliveStream:
    """One LeaseKeepAlive stream. Its own task writes the lease ids asked for, one at a time, and
    a reader gives each answer to the renewal of that lease waiting longest (etcd answers one
    lease's renewals in the order asked). A renewal never writes itself: grpc.aio cancels the
    whole call when a write is cancelled, so a caller that gave up (a worker's deadline) would
    fail every renewal on the stream, and their leases would lapse with it."""

    def __init__(self, client: aetcd.Client, endpoint: str) -> None:
        self._endpoint = endpoint
        self.call = client.leasestub.LeaseKeepAlive(metadata=client.metadata)
        self.waiting: dict[int, deque[asyncio.Future]] = {}
        self._unwritten: deque[int] = deque()
        self._wake = asyncio.Event()
        self.ended = False
        loop = asyncio.get_running_loop()
        self._writer = loop.create_task(self._write(), name=f"etcd-keepalive-write-{endpoint}")
        self._reader = loop.create_task(self._read(), name=f"etcd-keepalive-read-{endpoint}")

    def backlog(self) -> int:
        """Renewals waiting for the write in flight. Not the write itself: its answer can wake the
        renewal's caller before the writer task notices the write is done, and a caller renewing
        again at once would then find the stream busy and open another (seen in a test)."""
        return len(self._unwritten)

    def renew(self, lease: LeaseId) -> asyncio.Future:
        waiter = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(lease, deque()).append(waiter)
        self._unwritten.append(lease)
        self._wake.set()
        return waiter

    def forget(self, lease: LeaseId, waiter: asyncio.Future) -> None:
        """The renewal's caller stopped waiting (answered, failed, timed out or cancelled). Its
        write is still made if it was not yet: an answer nobody waits for is dropped."""
        if not waiter.done():
            waiter.cancel()
        elif not waiter.cancelled():
            waiter.exception()  # retrieved: a failure its caller did not await is not logged as lost
        queue = self.waiting.get(lease)
        if queue is not None:
            if waiter in queue:
                queue.remove(waiter)
            if not queue:
                del self.waiting[lease]

    def end(self) -> None:
        self.ended = True
        self.call.cancel()
        self._writer.cancel()
        self._reader.cancel()

    async def _write(self) -> None:
        try:
            while True:
                while not self._unwritten:
                    self._wake.clear()
                    await self._wake.wait()
                lease = self._unwritten.popleft()
                await self.call.write(rpc.LeaseKeepAliveRequest(ID=lease))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):  # the stream ended: the reader fails the waiters
            self.call.cancel()

    async def _read(self) -> None:
        code, detail = grpc.StatusCode.UNAVAILABLE, "the stream ended"
        try:
            while True:
                reply = await self.call.read()
                if reply is grpc.aio.EOF:
                    break
                queue = self.waiting.get(reply.ID)
                while queue:
                    waiter = queue.popleft()
                    if not waiter.done():
                        waiter.set_result(reply)
                        break
        except asyncio.CancelledError:
            raise
        except Exception as e:
            code, detail = (e.code(), e.details()) if isinstance(e, grpc.aio.AioRpcError) else (None, repr(e))
        finally:
            self.ended = True
            self.call.cancel()
            self._writer.cancel()
            # A new exception for each waiter (one raised in many places would keep every traceback).
            kind = StoreUnavailable if code in _UNAVAILABLE_CODES else StoreError
            for queue in self.waiting.values():
                for waiter in queue:
                    if not waiter.done():
                        waiter.set_exception(kind(f"etcd at {self._endpoint}: lease keep-alive stream failed: {detail}"))
