"""The etcd store on a real three-member etcd cluster on loopback: calls, leases and watches
carry on when the member in use dies; losing quorum makes calls fail with StoreUnavailable
(without hanging); when the members return, the same leases and data are there."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvplane.controlplane.store import StoreUnavailable, open_store

pytestmark = pytest.mark.cluster  # starts etcd processes


def test_the_store_fails_over_between_members_and_survives_losing_quorum(etcd_cluster_factory):
    etcd = etcd_cluster_factory()

    async def body() -> None:
        store = open_store(etcd.url)
        try:
            assert store.endpoint == ",".join(m.endpoint for m in etcd.members)
            lease = await store.lease_grant(10)
            await store.put("/t/worker", b"w", lease=lease)
            _, revision = await store.get_prefix("/t/")
            watch = store.watch_prefix("/t/", start_revision=revision + 1)
            await store.put("/t/first", b"0")
            seen = await watch.__anext__()  # the watch is open, on the member in use
            assert seen.key == "/t/first"

            # The member in use dies: everything goes on through another one.
            first = next(m for m in etcd.members if m.endpoint == store.current_endpoint)
            first.kill()
            await store.put("/t/a", b"1")
            assert (await store.get("/t/a")).value == b"1"
            assert await store.lease_keepalive(lease) > 0
            assert await store.transaction([], [])
            assert store.current_endpoint != first.endpoint
            # The watch broke with its member; re-opened after what it saw, it misses nothing.
            with pytest.raises(StoreUnavailable):
                async for event in watch:
                    seen = event
            async for event in store.watch_prefix("/t/", start_revision=seen.mod_revision + 1):
                assert (event.key, event.value) == ("/t/a", b"1")
                break

            # A second member dies: no quorum, calls fail promptly with StoreUnavailable.
            second = next(m for m in etcd.members if m.endpoint == store.current_endpoint)
            second.kill()
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.put("/t/b", b"2")
            assert time.monotonic() - started < 15
            with pytest.raises(StoreUnavailable):
                await store.lease_keepalive(lease)

            # Both come back: quorum, the data and the lease are there.
            first.restart()
            second.restart()
            etcd.wait_healthy()
            deadline = time.monotonic() + 20
            while True:
                try:
                    await store.put("/t/b", b"2")
                    break
                except StoreUnavailable:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            assert await store.lease_keepalive(lease) > 0
            items, _ = await store.get_prefix("/t/")
            assert {kv.key: kv.value for kv in items} == {"/t/worker": b"w", "/t/first": b"0", "/t/a": b"1", "/t/b": b"2"}
        finally:
            await store.close()

    asyncio.run(body())
