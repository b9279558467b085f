"""A Session owns one lease and keeps it alive (after etcd's client/v3/concurrency.Session).

Rule: renew every ttl/3 seconds, so two renewals can fail before the lease lapses. The session is
lost when the store answers that the lease is gone (TTL 0), or when no renewal has succeeded for a
full TTL (the store could not be reached); `wait_lost()` then returns and keys put under
`lease_id` must be assumed deleted. `close()` stops renewing and revokes the lease, which deletes
its keys at once.
"""
from __future__ import annotations

import asyncio
import logging

from kvplane.types import LeaseId

from .base import Store, StoreError, check_ttl

log = logging.getLogger(__name__)


class Session:
    def __init__(self, store: Store, ttl: int) -> None:
        check_ttl(ttl)
        self._store = store
        self._ttl = ttl
        self._lease_id: LeaseId | None = None
        self._keepalive_task: asyncio.Task | None = None
        self._lost = asyncio.Event()
        self._closed = False
        self.num_renewals = 0

    @property
    def ttl(self) -> int:
        return self._ttl

    @property
    def lease_id(self) -> LeaseId:
        if self._lease_id is None:
            raise RuntimeError("session not started: use `async with Session(...)` or `await session.start()`")
        return self._lease_id

    @property
    def is_lost(self) -> bool:
        return self._lost.is_set()

    async def start(self) -> Session:
        """Grant the lease and start renewing it; returns self."""
        if self._lease_id is not None or self._closed:
            raise RuntimeError("a Session can be started only once")
        self._lease_id = await self._store.lease_grant(self._ttl)
        self._keepalive_task = asyncio.create_task(self._keep_alive(), name=f"lease-keepalive-{self._lease_id}")
        return self

    async def wait_lost(self) -> None:
        """Return once the lease is known to be gone (not when the session is closed normally)."""
        await self._lost.wait()

    async def close(self) -> None:
        """Stop renewing and revoke the lease. Best effort: if the store is unreachable, the lease
        simply expires after its TTL, so the failure is logged and not raised."""
        if self._closed:
            return
        self._closed = True
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
            try:
                await self._keepalive_task
            except asyncio.CancelledError:
                pass
        if self._lease_id is not None and not self._lost.is_set():
            try:
                await self._store.lease_revoke(self._lease_id)
            except StoreError as err:
                log.warning("could not revoke lease %s (it will expire in <= %d s): %s", self._lease_id, self._ttl, err)

    async def __aenter__(self) -> Session:
        return await self.start()

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._ttl / 3
        last_renewed = loop.time()
        while True:
            await asyncio.sleep(interval)
            try:
                remaining = await self._store.lease_keepalive(self.lease_id)
            except StoreError as err:
                if loop.time() - last_renewed >= self._ttl:
                    log.error("lease %s lost: no renewal for %d s (%s)", self._lease_id, self._ttl, err)
                    self._lost.set()
                    return
                log.warning("renewing lease %s failed, will retry: %s", self._lease_id, err)
                continue
            if remaining <= 0:
                log.error("lease %s lost: the store no longer has it", self._lease_id)
                self._lost.set()
                return
            last_renewed = loop.time()
            self.num_renewals += 1
