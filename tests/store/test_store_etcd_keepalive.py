"""Lease keep-alives on etcd share one LeaseKeepAlive stream per member (controlplane/store/etcd.py),
and a stream that etcd ends (a restart) is opened again by the next renewal."""

from __future__ import annotations

import asyncio

import pytest

from kvplane.controlplane.store import StoreUnavailable, open_store

pytestmark = pytest.mark.cluster  # starts etcd


def test_keepalives_share_one_stream_and_a_restarted_etcd_gets_a_new_one(etcd_factory):
    etcd = etcd_factory()

    async def body() -> None:
        store = open_store(etcd.url)
        try:
            lease = await store.lease_grant(60)
            assert await store.lease_keepalive(lease) == 60
            stream = _first(store)._call
            assert stream is not None
            for _ in range(5):
                assert await store.lease_keepalive(lease) == 60
            assert _first(store)._call is stream  # no stream per renewal
            await asyncio.to_thread(etcd.restart)  # same data: the lease survives
            for _ in range(50):  # the first renewals may still meet the old stream or a reconnecting channel
                try:
                    if await store.lease_keepalive(lease) == 60:
                        break
                except StoreUnavailable:
                    pass
                await asyncio.sleep(0.2)
            else:
                raise AssertionError("no renewal succeeded after etcd restarted")
            assert _first(store)._call is not stream
            assert _first(store)._waiting == {}  # nothing left waiting
        finally:
            await store.close()

    asyncio.run(body())


def _first(store):
    """The keep-alive streams of the store's only member."""
    (keepalives,) = store._keepalives.values()
    return keepalives
