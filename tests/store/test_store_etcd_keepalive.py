"""Lease keep-alives on etcd share a few LeaseKeepAlive streams per member (controlplane/store/etcd.py):
a stream that etcd ends (a restart) is replaced by the next renewal, and a renewal whose caller
gives up does not take the others on its stream down with it."""

from __future__ import annotations

import asyncio

import pytest

from kvplane.controlplane.store import StoreUnavailable, open_store
from kvplane.controlplane.store.etcd import KEEPALIVE_STREAMS

pytestmark = pytest.mark.cluster  # starts etcd


def test_keepalives_share_one_stream_and_a_restarted_etcd_gets_a_new_one(etcd_factory):
    etcd = etcd_factory()

    async def body() -> None:
        store = open_store(etcd.url)
        try:
            lease = await store.lease_grant(60)
            assert await store.lease_keepalive(lease) == 60
            (stream,) = _first(store).streams
            for _ in range(5):
                assert await store.lease_keepalive(lease) == 60
            assert _first(store).streams == [stream]  # no stream per renewal, nor more when one is idle
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
            assert stream not in _first(store).streams
            assert all(s.waiting == {} for s in _first(store).streams)  # nothing left waiting
        finally:
            await store.close()

    asyncio.run(body())


def test_a_renewal_given_up_does_not_fail_the_others(etcd_factory):
    """A worker's keep-alive whose deadline passes cancels its renewal on the replica. grpc.aio
    cancels a whole stream when a write on it is cancelled: before the writer tasks, one such
    renewal failed every renewal waiting on the stream, and busy replicas let leases lapse."""
    etcd = etcd_factory()

    async def body() -> None:
        store = open_store(etcd.url)
        try:
            leases = [await store.lease_grant(60) for _ in range(40)]
            for _ in range(3):
                renewals = [asyncio.create_task(store.lease_keepalive(lease)) for lease in leases for _ in range(5)]
                await asyncio.sleep(0)  # every renewal is queued, the first writes have started
                for given_up in renewals[::2]:
                    given_up.cancel()
                answers = await asyncio.gather(*renewals[1::2])
                assert answers == [60] * len(answers)
                await asyncio.gather(*renewals[::2], return_exceptions=True)
            keepalives = _first(store)
            assert 1 < len(keepalives.streams) <= KEEPALIVE_STREAMS  # busy streams were joined by more, up to the cap
            assert all(not s.ended for s in keepalives.streams)
            assert await store.lease_keepalive(leases[0]) == 60
            assert all(s.waiting == {} for s in keepalives.streams)
        finally:
            await store.close()

    asyncio.run(body())


def _first(store):
    """The keep-alive streams of the store's only member."""
    (keepalives,) = store._keepalives.values()
    return keepalives
