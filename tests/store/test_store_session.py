"""Session: one lease, renewed at ttl/3, revoked on close, reported lost when it goes away."""
from __future__ import annotations

import asyncio

import pytest

from controlplane.store import MemoryStore, Session, Store, open_store


def test_session_renews_and_close_revokes(store):
    async def body(s: Store, p: str) -> None:
        async with Session(s, ttl=1) as session:
            assert session.ttl == 1
            await s.put(p + "member", b"", session.lease_id)
            await asyncio.sleep(2.2)  # past TTL 1 s plus etcd's expiry slack
            assert (await s.get(p + "member")).lease == session.lease_id
            assert session.num_renewals >= 4  # ~6 at one per 1/3 s; slack for a loaded machine
            assert not session.is_lost
        assert await s.get(p + "member") is None
        assert await s.lease_keepalive(session.lease_id) == 0

    store.run(body)


def test_session_reports_a_lost_lease(store):
    async def body(s: Store, p: str) -> None:
        session = await Session(s, ttl=1).start()
        await s.lease_revoke(session.lease_id)  # e.g. an operator removed it
        await asyncio.wait_for(session.wait_lost(), 2)
        assert session.is_lost
        await session.close()
        await session.close()  # idempotent

    store.run(body)


def test_session_is_lost_when_the_store_stays_unreachable(etcd_factory):
    server = etcd_factory()

    async def body() -> None:
        s = open_store(server.url)
        session = await Session(s, ttl=1).start()
        server.kill()
        await asyncio.wait_for(session.wait_lost(), 3)  # after a full TTL without a renewal
        assert session.is_lost
        await session.close()
        await s.close()

    asyncio.run(body())


def test_session_misuse_is_explained():
    async def body() -> None:
        session = Session(MemoryStore(), ttl=5)
        with pytest.raises(RuntimeError, match="session not started"):
            session.lease_id
        await session.start()
        with pytest.raises(RuntimeError, match="started only once"):
            await session.start()
        await session.close()

    asyncio.run(body())
    with pytest.raises(ValueError, match="lease TTL must be a whole number"):
        Session(MemoryStore(), ttl=0)
