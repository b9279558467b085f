"""Registry service: agents register under a store lease, keep it alive, report load and KV events.

The control plane only relays to the store; the lease lives in the store, so any replica can
serve an agent's keep-alive and a replica's death loses nothing.
"""

from __future__ import annotations

import logging
import time

import grpc

from controlplane import keys, registration
from controlplane.config import ControlPlaneConfig
from controlplane.store.base import Delete, Put, Store, StoreError
from kvplane.types import LeaseId
from kvplane.v1 import common_pb2, registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)


def validate_worker_info(info: common_pb2.WorkerInfo) -> str | None:
    """A sentence naming what is wrong with a registration, or None."""
    if not info.worker_id or "/" in info.worker_id:
        return "worker_id must be a non-empty string without '/'"
    if info.role == common_pb2.ROLE_UNSPECIFIED:
        return "role must be prefill, decode or both"
    if not info.endpoint:
        return "endpoint (host:port of the agent) is required"
    if not info.model:
        return "model is required"
    if info.layout.block_size == 0 or info.layout.num_layers == 0:
        return "layout must give at least block_size and num_layers"
    if info.max_context == 0 or info.vocab_size == 0:
        return "max_context and vocab_size are required"
    return None


class RegistryService(registry_pb2_grpc.RegistryServicer):
    def __init__(self, store: Store, config: ControlPlaneConfig, ticket_key: bytes) -> None:
        self._store = store
        self._config = config
        self._ticket_key = ticket_key
        self._last_compaction: dict[str, float] = {}

    async def Register(self, request: registry_pb2.RegisterRequest, context: grpc.aio.ServicerContext):
        problem = validate_worker_info(request.info)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad registration: {problem}")
        await self._check_fits_cluster(request.info, context)
        ttl = request.ttl_seconds or self._config.lease_ttl_s
        info = common_pb2.WorkerInfo()
        info.CopyFrom(request.info)
        if info.state == common_pb2.WORKER_STATE_UNSPECIFIED:
            info.state = common_pb2.WORKER_STATE_ACTIVE
        try:
            lease = await self._store.lease_grant(ttl)
            # A re-registering worker starts its KV log afresh; its first batch is a snapshot.
            await self._store.transaction(
                [],
                [
                    Delete(keys.kv_prefix(info.worker_id), prefix=True),
                    Put(keys.worker_key(info.worker_id), info.SerializeToString(), lease=lease),
                ],
            )
        except StoreError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {e}")
        log.info("registered %s (lease %x, ttl %ds)", info.worker_id, lease, ttl)
        reply = registry_pb2.RegisterResponse(worker_id=info.worker_id, lease_id=lease, ttl_seconds=ttl, ticket_key=self._ticket_key)
        stored_profile = await self._store.get(keys.profile_key(info.worker_id))
        if stored_profile is not None:
            reply.profile.ParseFromString(stored_profile.value)
        return reply

    async def _check_fits_cluster(self, info: common_pb2.WorkerInfo, context: grpc.aio.ServicerContext) -> None:
        try:
            items, _ = await self._store.get_prefix(keys.WORKERS)
        except StoreError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {e}")
        registered = [common_pb2.WorkerInfo.FromString(kv.value) for kv in items]
        problem = registration.mismatch(info, registered, self._config.models, self._config.block_size)
        if problem:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"registration refused: {problem}")

    async def KeepAlive(self, request: registry_pb2.KeepAliveRequest, context: grpc.aio.ServicerContext):
        try:
            ttl = await self._store.lease_keepalive(LeaseId(request.lease_id))
        except StoreError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {e}")
        return registry_pb2.KeepAliveResponse(ttl_seconds=max(int(ttl), 0))

    async def ReportLoad(self, request: registry_pb2.ReportLoadRequest, context: grpc.aio.ServicerContext):
        await self._put_under_lease(context, keys.load_key(request.worker_id), request, request.lease_id)
        return registry_pb2.ReportLoadResponse()

    async def PublishKVEvents(self, request: registry_pb2.PublishKVEventsRequest, context: grpc.aio.ServicerContext):
        if not request.worker_id or request.seq == 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "worker_id and a seq >= 1 are required")
        await self._put_under_lease(context, keys.kv_key(request.worker_id, request.seq), request, request.lease_id)
        if request.snapshot:
            await self._maybe_compact(request.worker_id, request.seq)
        return registry_pb2.PublishKVEventsResponse()

    async def Deregister(self, request: registry_pb2.DeregisterRequest, context: grpc.aio.ServicerContext):
        try:
            await self._store.lease_revoke(LeaseId(request.lease_id))
        except StoreError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {e}")
        return registry_pb2.DeregisterResponse()

    async def _put_under_lease(self, context, key: str, message, lease_id: int) -> None:
        if not lease_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "lease_id is required: register first")
        try:
            # The worker key must still exist under this lease, or the worker is gone: writing
            # load or events for it would resurrect a dead worker's keys.
            worker_id = message.worker_id
            current = await self._store.get(keys.worker_key(worker_id))
            if current is None or current.lease != lease_id:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, f"worker {worker_id!r} is not registered under lease {lease_id:x}: register again"
                )
            await self._store.put(key, message.SerializeToString(), lease=LeaseId(lease_id))
        except StoreError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {e}")

    async def _maybe_compact(self, worker_id: str, snapshot_seq: int) -> None:
        now = time.monotonic()
        if now - self._last_compaction.get(worker_id, 0.0) < self._config.kv_compact_every_s:
            return
        self._last_compaction[worker_id] = now
        items, _ = await self._store.get_prefix(keys.kv_prefix(worker_id))
        stale = [kv.key for kv in items if keys.parse_kv_key(kv.key)[1] < snapshot_seq]
        for key in stale:
            await self._store.delete(key)
        if stale:
            log.debug("compacted %d KV batches of %s", len(stale), worker_id)
