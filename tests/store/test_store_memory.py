"""Memory-backend specifics: bounded watch history and exact lease deadlines."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvplane.controlplane.store import EventType, MemoryStore, StoreCompacted


def test_bounded_history_raises_the_compaction_floor():
    async def body() -> None:
        store = MemoryStore(max_history_events=3)
        revisions = [await store.put(f"k{i}", b"") for i in range(5)]
        assert revisions == [2, 3, 4, 5, 6]
        # Events at revisions 2 and 3 were dropped, so watches may start at 4 or later.
        with pytest.raises(StoreCompacted, match="cannot watch 'k' from revision 3") as info:
            await store.watch_prefix("k", start_revision=3).__anext__()
        assert info.value.compact_revision == 4
        watch = store.watch_prefix("k", start_revision=4)
        assert [(await watch.__anext__()).mod_revision for _ in range(3)] == [4, 5, 6]
        await watch.aclose()
        await store.close()

    asyncio.run(body())


def test_overdue_lease_is_expired_before_any_read_even_if_its_timer_is_late():
    async def body() -> None:
        store = MemoryStore()
        lease = await store.lease_grant(1)
        await store.put("k", b"", lease)
        time.sleep(1.05)  # block the loop: the expiry timer cannot run
        assert await store.get("k") is None
        items, revision = await store.get_prefix("")
        assert (items, revision) == ([], 3)
        assert await store.lease_keepalive(lease) == 0
        await store.close()

    asyncio.run(body())


def test_keepalive_moves_the_deadline():
    async def body() -> None:
        store = MemoryStore()
        lease = await store.lease_grant(1)
        await store.put("k", b"", lease)
        await asyncio.sleep(0.6)
        assert await store.lease_keepalive(lease) == 1
        await asyncio.sleep(0.6)  # 1.2 s after the grant, 0.6 s after the renewal
        assert (await store.get("k")).lease == lease
        watch = store.watch_prefix("k", start_revision=3)
        event = await asyncio.wait_for(watch.__anext__(), 1)
        assert (event.type, event.key, event.mod_revision) == (EventType.DELETE, "k", 3)
        await watch.aclose()
        await store.close()

    asyncio.run(body())


def test_max_history_must_be_positive():
    with pytest.raises(ValueError, match="max_history_events must be >= 1"):
        MemoryStore(max_history_events=0)
