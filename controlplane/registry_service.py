"""Registry service: agents register under a store lease, keep it alive, report load and KV events.

Registrations and leases go to the store; load reports and KV event batches to the bus
(controlplane/bus/), which brings them to every replica. The lease lives in the store, so any
replica can serve an agent's keep-alive and a replica's death loses nothing. The answer to a load
report says whether some replica asked this worker for a KV snapshot (cluster_state.py: a gap in
its event numbers).

Who may do what (docs/security.md): Register needs a worker identity, either a certificate naming
that worker id or the cluster's join token (which may claim any id that is free). A live
registration cannot be taken over: only the same certificate may register its id again while the
lease lives (a restarted agent), which ends the old lease. Register returns a session token bound
to (worker id, lease), and every later call must carry it, so a worker can only renew, report for
and deregister its own registration. Leases are capped (max_lease_ttl_s), workers per cluster,
block hashes per batch and blocks per worker are bounded, and no message echoes unbounded input.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

import grpc

from kvplane import tickets
from kvplane.controlplane import keys, registration
from kvplane.controlplane.batch_limits import batch_problem
from kvplane.controlplane.bus import Bus, BusUnavailable, StoreBus
from kvplane.controlplane.config import ControlPlaneConfig
from kvplane.controlplane.secrets import ClusterSecrets
from kvplane.controlplane.store.base import Compare, Delete, LeaseNotFound, Put, Store, StoreError
from kvplane.errors import component_trailers
from kvplane.security.auth import caller
from kvplane.security.identity import ANY_WORKER, IdentityError, Role, check_name
from kvplane.security.limits import MAX_RUNNING_LISTED, clip
from kvplane.types import LeaseId, WorkerId
from kvplane.v1 import common_pb2, registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)

_MAX_FIELD_CHARS = 256  # endpoint, model and the like


def validate_worker_info(info: common_pb2.WorkerInfo) -> str | None:
    """A sentence naming what is wrong with a registration, or None."""
    try:
        check_name(info.worker_id, "worker_id")
    except IdentityError as e:
        return str(e)
    if info.role == common_pb2.ROLE_UNSPECIFIED or info.role not in common_pb2.Role.values():
        return "role must be prefill, decode or both"
    if not info.endpoint:
        return "endpoint (host:port of the agent) is required"
    if not info.model:
        return "model is required"
    if max(len(info.endpoint), len(info.model), len(info.metrics_url), len(info.layout.model), len(info.layout.dtype)) > _MAX_FIELD_CHARS:
        return f"endpoint, model, metrics_url and layout strings must be at most {_MAX_FIELD_CHARS} characters"
    if info.layout.block_size == 0 or info.layout.num_layers == 0:
        return "layout must give at least block_size and num_layers"
    if info.max_context == 0 or info.vocab_size == 0:
        return "max_context and vocab_size are required"
    if len(info.transports) > 8 or any(len(t) > 32 for t in info.transports):
        return "at most 8 transports of at most 32 characters"
    return None


class RegistryService(registry_pb2_grpc.RegistryServicer):
    def __init__(
        self,
        store: Store,
        config: ControlPlaneConfig,
        secrets: ClusterSecrets,
        *,
        num_workers: Callable[[], int] = lambda: 0,
        blocks_of: Callable[[WorkerId], int] = lambda worker_id: 0,
        snapshot_requested: Callable[[str], bool] = lambda worker_id: False,
        bus: Bus | None = None,
        lease_of: Callable[[str], int | None] = lambda worker_id: None,
        registered: Callable[[], Iterable[common_pb2.WorkerInfo]] = lambda: (),
    ) -> None:
        self._store = store
        self._bus = bus if bus is not None else StoreBus(store, kv_compact_every_s=config.kv_compact_every_s)
        self._lease_of = lease_of  # the lease this replica's view has for a worker (cluster_state.py)
        # The registered workers as this replica's view holds them: a registration is checked
        # against them without listing (and parsing) every worker from the store each time.
        self._registered = registered
        self._snapshot_requested = snapshot_requested  # a replica found a gap in this worker's KV events
        self._config = config
        self._batch_limits = config.batch_limits  # built once: every PublishKVEvents call checks against it
        self._secrets = secrets
        self._public_key = tickets.public_key_of(secrets.signing_key)
        self._num_workers = num_workers  # registered workers, as this replica sees them
        self._blocks_of = blocks_of  # blocks the cache index holds for a worker

    async def Register(self, request: registry_pb2.RegisterRequest, context: grpc.aio.ServicerContext):
        problem = validate_worker_info(request.info)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad registration: {problem}")
        worker_id = request.info.worker_id
        identity = caller()
        owner = identity is not None and identity.role is Role.WORKER and identity.name == worker_id
        if identity is not None and not owner and identity.name != ANY_WORKER:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, f"{identity} may register only worker id {identity.name!r}, not {worker_id!r}"
            )
        ttl = min(request.ttl_seconds or self._config.lease_ttl_s, self._config.max_lease_ttl_s)
        ttl = max(ttl, 2)
        problem = registration.mismatch(request.info, self._registered(), self._config.models, self._config.block_size)
        if problem:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"registration refused: {problem}")
        info = common_pb2.WorkerInfo()
        info.CopyFrom(request.info)
        if info.state == common_pb2.WORKER_STATE_UNSPECIFIED:
            info.state = common_pb2.WORKER_STATE_ACTIVE
        worker_key = keys.worker_key(worker_id)
        try:
            current = await self._store.get(worker_key)
            if current is not None and not owner:
                await context.abort(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"worker id {worker_id!r} is registered and its lease is alive; pick another id or wait for the lease to end",
                )
            if current is None and self._num_workers() >= self._config.max_workers:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, f"the cluster has its maximum of {self._config.max_workers} workers"
                )
            if current is not None and current.lease:
                await self._store.lease_revoke(current.lease)  # the same worker, restarted: its old lease ends
            lease = await self._store.lease_grant(ttl)
            # A re-registering worker starts its KV log afresh; its first batch is a snapshot. The
            # comparison makes two registrations racing for one id end with one winner.
            guard = Compare.absent(worker_key) if current is None or owner else Compare.mod_revision(worker_key, "==", current.mod_revision)
            won = await self._store.transaction(
                [guard],
                [
                    Delete(keys.kv_prefix(worker_id), prefix=True),
                    Delete(keys.resync_key(worker_id)),
                    Put(worker_key, info.SerializeToString(), lease=lease),
                ],
            )
            if not won:
                await self._store.lease_revoke(lease)
                await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"worker id {worker_id!r} was registered by someone else just now")
            stored_profile = await self._store.get(keys.profile_key(worker_id))
        except StoreError as e:
            await _store_unavailable(context, e)
        try:
            await self._bus.forget_worker(worker_id)
        except BusUnavailable as e:  # its old messages name the old lease: replicas ignore them anyway
            log.warning("the bus kept %s's earlier messages: %s", worker_id, e)
        log.info("registered %s as %s (lease %x, ttl %ds)", worker_id, identity or "unauthenticated", lease, ttl)
        reply = registry_pb2.RegisterResponse(
            worker_id=worker_id, lease_id=lease, ttl_seconds=ttl, ticket_public_key=self._public_key,
            session_token=self._secrets.session_token(worker_id, lease), bus_url=self._config.bus_for_agents,
        )  # fmt: skip
        if stored_profile is not None:
            reply.profile.ParseFromString(stored_profile.value)
        return reply

    async def _check_session(self, context, worker_id: str, lease_id: int, token: bytes) -> None:
        """Aborts unless the caller holds the session of (worker_id, lease_id)."""
        identity = caller()
        if identity is not None and identity.name not in (worker_id, ANY_WORKER):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{identity} may act only for worker {identity.name!r}")
        if not lease_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "lease_id is required: register first")
        if not self._secrets.session_valid(worker_id, lease_id, token):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"no valid session token for worker {clip(worker_id)} and lease {lease_id:x}: only the worker that registered may do this",
            )

    async def KeepAlive(self, request: registry_pb2.KeepAliveRequest, context: grpc.aio.ServicerContext):
        return await self._keep_alive(request, context)

    async def KeepAliveStream(self, request_iterator, context: grpc.aio.ServicerContext):
        async for request in request_iterator:
            yield await self._keep_alive(request, context)

    async def _keep_alive(self, request: registry_pb2.KeepAliveRequest, context: grpc.aio.ServicerContext):
        await self._check_session(context, request.worker_id, request.lease_id, request.session_token)
        try:
            ttl = await self._store.lease_keepalive(LeaseId(request.lease_id))
        except StoreError as e:
            await _store_unavailable(context, e)
        # A worker publishing its reports to the bus gets no answer there: snapshot requests come here.
        return registry_pb2.KeepAliveResponse(ttl_seconds=max(int(ttl), 0), snapshot_requested=self._snapshot_requested(request.worker_id))

    async def ReportLoad(self, request: registry_pb2.ReportLoadRequest, context: grpc.aio.ServicerContext):
        return await self._report(request, context)

    async def ReportLoadStream(self, request_iterator, context: grpc.aio.ServicerContext):
        async for request in request_iterator:
            yield await self._report(request, context)

    async def _report(self, request: registry_pb2.ReportLoadRequest, context: grpc.aio.ServicerContext):
        await self._check_session(context, request.worker_id, request.lease_id, request.session_token)
        if len(request.load.running_remaining_tokens) > MAX_RUNNING_LISTED:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"running_remaining_tokens lists more than {MAX_RUNNING_LISTED:,} requests"
            )
        request.ClearField("session_token")  # the bus carries what replicas need, not the credential
        await self._publish(context, self._bus.publish_load, request)
        return registry_pb2.ReportLoadResponse(snapshot_requested=self._snapshot_requested(request.worker_id))

    async def PublishKVEvents(self, request: registry_pb2.PublishKVEventsRequest, context: grpc.aio.ServicerContext):
        await self._check_session(context, request.worker_id, request.lease_id, request.session_token)
        problem = batch_problem(request, self._batch_limits, self._blocks_of(WorkerId(request.worker_id)))
        if problem is not None:
            await context.abort(*problem)
        request.ClearField("session_token")
        await self._publish(context, self._bus.publish_kv, request)
        return registry_pb2.PublishKVEventsResponse()

    async def Deregister(self, request: registry_pb2.DeregisterRequest, context: grpc.aio.ServicerContext):
        await self._check_session(context, request.worker_id, request.lease_id, request.session_token)
        try:
            await self._store.lease_revoke(LeaseId(request.lease_id))
        except StoreError as e:
            await _store_unavailable(context, e)
        return registry_pb2.DeregisterResponse()

    async def _publish(self, context, publish: Callable[..., Awaitable[None]], message) -> None:
        worker_id, lease_id = message.worker_id, message.lease_id
        try:
            # The worker must still be registered under this lease, or it is gone: a report for it
            # would resurrect a dead worker. This replica's view answers for a registration it has
            # seen; the store for one it has not seen yet (registered through another replica).
            if self._lease_of(worker_id) != lease_id:
                current = await self._store.get(keys.worker_key(worker_id))
                if current is None or current.lease != lease_id:
                    await _not_registered(context, worker_id, lease_id)
            await publish(message)
        except LeaseNotFound:  # the store bus: the lease ended since this replica's view saw it
            await _not_registered(context, worker_id, lease_id)
        except StoreError as e:
            await _store_unavailable(context, e)
        except BusUnavailable as e:
            context.set_trailing_metadata(component_trailers("bus"))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"bus unavailable: {e}")


async def _not_registered(context, worker_id: str, lease_id: int) -> None:
    await context.abort(grpc.StatusCode.NOT_FOUND, f"worker {worker_id!r} is not registered under lease {lease_id:x}: register again")


async def _store_unavailable(context, e: StoreError) -> None:
    """UNAVAILABLE naming the store (a trailer too: the replica answered; another would say the same)."""
    context.set_trailing_metadata(component_trailers("store"))
    await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {e}")
