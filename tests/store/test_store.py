"""One behavioural suite, run against both store backends (memory and a real etcd)."""

from __future__ import annotations

import asyncio

import pytest

from kvplane.controlplane.store import (
    Compare,
    Delete,
    EventType,
    KeyValue,
    LeaseNotFound,
    Put,
    Store,
    StoreCompacted,
    StoreError,
    WatchEvent,
)
from kvplane.types import LeaseId


def put_event(key: str, value: bytes, revision: int) -> WatchEvent:
    return WatchEvent(EventType.PUT, key, value, revision)


def delete_event(key: str, revision: int) -> WatchEvent:
    return WatchEvent(EventType.DELETE, key, b"", revision)


async def next_revision(store: Store, prefix: str) -> int:
    """The first revision a watch must start at to see every write made from now on."""
    _, revision = await store.get_prefix(prefix)
    return revision + 1


async def take(events, num_events: int, timeout_s: float = 5.0) -> list[WatchEvent]:
    taken: list[WatchEvent] = []

    async def pull() -> None:
        async for event in events:
            taken.append(event)
            if len(taken) == num_events:
                return

    await asyncio.wait_for(pull(), timeout_s)
    return taken


# ---- key/value ---------------------------------------------------------------------------


def test_get_put_delete(store):
    async def body(s: Store, p: str) -> None:
        key = p + "k"
        assert await s.get(key) is None
        rev1 = await s.put(key, b"v1")
        assert await s.get(key) == KeyValue(key, b"v1", rev1, rev1, 1, None)
        rev2 = await s.put(key, b"v2")
        assert rev2 == rev1 + 1
        assert await s.get(key) == KeyValue(key, b"v2", rev1, rev2, 2, None)
        assert await s.delete(key) is True
        assert await s.get(key) is None
        assert await s.delete(key) is False
        rev3 = await s.put(key, b"v3")  # a re-created key starts a new life: version 1
        assert await s.get(key) == KeyValue(key, b"v3", rev3, rev3, 1, None)

    store.run(body)


def test_revisions_advance_by_one_per_change_and_not_on_noop(store):
    async def body(s: Store, p: str) -> None:
        rev1 = await s.put(p + "a", b"1")
        rev2 = await s.put(p + "b", b"2")
        assert rev2 == rev1 + 1
        assert await s.delete(p + "missing") is False
        assert await s.delete_prefix(p + "nothing/") == 0
        assert (await s.get_prefix(p))[1] == rev2
        await s.delete(p + "a")
        assert (await s.get_prefix(p))[1] == rev2 + 1

    store.run(body)


def test_put_rejects_values_that_are_not_bytes(store):
    async def body(s: Store, p: str) -> None:
        with pytest.raises(TypeError, match=r"the value for '.*k' must be bytes, got str; encode it first"):
            await s.put(p + "k", "text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be bytes, got bytearray"):
            await s.put(p + "k", bytearray(b"x"))  # type: ignore[arg-type]
        assert await s.get(p + "k") is None

    store.run(body)


def test_get_prefix_is_sorted_bounded_and_reports_revision(store):
    async def body(s: Store, p: str) -> None:
        for name in ["dir/é", "dir/b", "dir/a", "dir/a/x", "dirx", "di"]:
            last_rev = await s.put(p + name, name.encode())
        items, revision = await s.get_prefix(p + "dir/")
        # UTF-8 byte order, as etcd sorts: "é" (U+00E9) after "b"; "dirx" and "di" are outside.
        assert [kv.key for kv in items] == [p + "dir/a", p + "dir/a/x", p + "dir/b", p + "dir/é"]
        assert [kv.value for kv in items] == [b"dir/a", b"dir/a/x", b"dir/b", "dir/é".encode()]
        assert revision == last_rev
        assert await s.get_prefix(p + "nothing/") == ([], last_rev)
        assert await s.delete_prefix(p + "dir/") == 4
        assert [kv.key for kv in (await s.get_prefix(p))[0]] == [p + "di", p + "dirx"]

    store.run(body)


def test_empty_prefix_means_every_key(store):
    async def body(s: Store, p: str) -> None:
        await s.put(p + "b", b"")
        await s.put(p + "a", b"")
        items, _ = await s.get_prefix("")
        keys = [kv.key for kv in items]
        assert keys == sorted(keys, key=str.encode)
        assert [k for k in keys if k.startswith(p)] == [p + "a", p + "b"]

    store.run(body)


# ---- transactions ------------------------------------------------------------------------

# (compare built against a key holding b"m" at version 2, created at c and modified at m) -> holds?
COMPARE_CASES = [
    (lambda k, c, m: Compare.value(k, "==", b"m"), True),
    (lambda k, c, m: Compare.value(k, "==", b"x"), False),
    (lambda k, c, m: Compare.value(k, "!=", b"x"), True),
    (lambda k, c, m: Compare.value(k, "<", b"n"), True),
    (lambda k, c, m: Compare.value(k, ">", b"n"), False),
    (lambda k, c, m: Compare.version(k, "==", 2), True),
    (lambda k, c, m: Compare.version(k, ">", 2), False),
    (lambda k, c, m: Compare.version(k, "<", 3), True),
    (lambda k, c, m: Compare.mod_revision(k, "==", m), True),
    (lambda k, c, m: Compare.mod_revision(k, "!=", m), False),
    (lambda k, c, m: Compare.create_revision(k, "==", c), True),
    (lambda k, c, m: Compare.create_revision(k, "<", c), False),
    (lambda k, c, m: Compare.exists(k), True),
    (lambda k, c, m: Compare.absent(k), False),
]


def test_transaction_each_compare_picks_the_right_branch(store):
    async def body(s: Store, p: str) -> None:
        key, out = p + "guarded", p + "outcome"
        created = await s.put(key, b"a")
        modified = await s.put(key, b"m")
        for i, (make, expected) in enumerate(COMPARE_CASES):
            compare = make(key, created, modified)
            succeeded = await s.transaction([compare], [Put(out, b"success")], [Put(out, b"failure")])
            assert succeeded is expected, f"case {i}: {compare}"
            assert (await s.get(out)).value == (b"success" if expected else b"failure"), f"case {i}"

    store.run(body)


def test_transaction_on_missing_key(store):
    async def body(s: Store, p: str) -> None:
        key = p + "missing"
        # A missing key has version, create_revision and mod_revision 0 ...
        assert await s.transaction([Compare.absent(key)], [Put(key, b"created")]) is True
        assert (await s.get(key)).value == b"created"
        # ... and create-if-absent fails once it exists, leaving the value alone.
        assert await s.transaction([Compare.absent(key)], [Put(key, b"again")]) is False
        assert (await s.get(key)).value == b"created"
        other = p + "other"
        assert await s.transaction([Compare.create_revision(other, "==", 0)], []) is True
        assert await s.transaction([Compare.mod_revision(other, "==", 0)], []) is True
        # etcd: a value comparison on a missing key is false whatever the operator.
        assert await s.transaction([Compare.value(other, "!=", b"x")], []) is False
        assert await s.transaction([Compare.value(other, "==", b"")], []) is False

    store.run(body)


def test_transaction_applies_all_ops_in_one_revision(store):
    async def body(s: Store, p: str) -> None:
        await s.put(p + "old/1", b"")
        await s.put(p + "old/2", b"")
        await s.put(p + "gone", b"")
        start = await next_revision(s, p)
        watch = s.watch_prefix(p, start_revision=start)
        ok = await s.transaction(
            [Compare.exists(p + "gone")],
            [Put(p + "new", b"n"), Delete(p + "gone"), Delete(p + "old/", prefix=True)],
        )
        assert ok is True
        items, revision = await s.get_prefix(p)
        assert revision == start
        assert items == [KeyValue(p + "new", b"n", start, start, 1, None)]
        events = await take(watch, 4)
        await watch.aclose()
        assert events == [
            put_event(p + "new", b"n", start),
            delete_event(p + "gone", start),
            delete_event(p + "old/1", start),
            delete_event(p + "old/2", start),
        ]
        # A failed guard with an empty failure branch changes nothing.
        assert await s.transaction([Compare.absent(p + "new")], [Delete(p + "new")]) is False
        assert (await s.get_prefix(p))[1] == start

    store.run(body)


def test_transaction_rejects_writing_one_key_twice(store):
    async def body(s: Store, p: str) -> None:
        with pytest.raises(ValueError, match="puts key .* twice"):
            await s.transaction([], [Put(p + "k", b"1"), Put(p + "k", b"2")])
        with pytest.raises(ValueError, match="both puts and deletes key"):
            await s.transaction([], [], [Put(p + "d/k", b"1"), Delete(p + "d/", prefix=True)])
        assert await s.get_prefix(p) == ([], (await s.get_prefix(p))[1])

    store.run(body)


def test_compare_validates_its_fields():
    with pytest.raises(ValueError, match="compare target 'size'"):
        Compare("k", "size", "==", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compare op '>='"):
        Compare("k", "version", ">=", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="value comparison needs a bytes operand, got str"):
        Compare.value("k", "==", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="version comparison needs an int operand, got bytes"):
        Compare.version("k", "==", b"1")  # type: ignore[arg-type]
    assert Compare.absent("k") == Compare("k", "version", "==", 0)
    assert Compare.exists("k") == Compare("k", "version", ">", 0)


# ---- watch -------------------------------------------------------------------------------


def test_watch_sees_puts_and_deletes_in_order(store):
    async def body(s: Store, p: str) -> None:
        start = await next_revision(s, p + "w/")
        watch = s.watch_prefix(p + "w/", start_revision=start)
        await s.put(p + "w/a", b"1")
        await s.put(p + "outside", b"not watched")
        await s.put(p + "w/b", b"2")
        await s.put(p + "w/a", b"3")
        await s.delete(p + "w/a")
        await s.delete_prefix(p + "w/")
        events = await take(watch, 5)
        await watch.aclose()
        assert events == [
            put_event(p + "w/a", b"1", start),
            put_event(p + "w/b", b"2", start + 2),
            put_event(p + "w/a", b"3", start + 3),
            delete_event(p + "w/a", start + 4),
            delete_event(p + "w/b", start + 5),
        ]

    store.run(body)


def test_watch_without_start_revision_sees_writes_after_it_starts(store):
    async def body(s: Store, p: str) -> None:
        await s.put(p + "before", b"")
        watch = s.watch_prefix(p)
        first = asyncio.ensure_future(watch.__anext__())
        # No signal says when the server has set the watch up: write until it reports a write.
        revisions = {}
        while not first.done():
            value = str(len(revisions)).encode()
            revisions[value] = await s.put(p + "after", value)
            await asyncio.wait({first}, timeout=0.05)
        event = first.result()
        assert event == put_event(p + "after", event.value, revisions[event.value])
        await watch.aclose()

    store.run(body)


def test_watch_replays_history_then_follows_live_writes(store):
    async def body(s: Store, p: str) -> None:
        rev_a = await s.put(p + "a", b"1")
        rev_b = await s.put(p + "b", b"2")
        watch = s.watch_prefix(p, start_revision=rev_a)
        assert await take(watch, 2) == [put_event(p + "a", b"1", rev_a), put_event(p + "b", b"2", rev_b)]
        rev_c = await s.put(p + "c", b"3")
        assert await take(watch, 1) == [put_event(p + "c", b"3", rev_c)]
        await watch.aclose()

    store.run(body)


def test_list_then_watch_from_next_revision_misses_nothing(store):
    num_keys = 150

    async def body(s: Store, p: str) -> None:
        halfway = asyncio.Event()

        async def writer() -> None:
            for i in range(num_keys):
                await s.put(f"{p}k{i:03d}", str(i).encode())
                if i == num_keys // 3:
                    halfway.set()
                await asyncio.sleep(0)

        writing = asyncio.create_task(writer())
        await halfway.wait()
        listed, revision = await s.get_prefix(p)
        watch = s.watch_prefix(p, start_revision=revision + 1)
        watched = await take(watch, num_keys - len(listed), timeout_s=15)
        await watch.aclose()
        await writing
        assert 0 < len(listed) < num_keys
        assert all(kv.mod_revision <= revision for kv in listed)
        assert all(e.mod_revision > revision and e.type is EventType.PUT for e in watched)
        keys = [kv.key for kv in listed] + [e.key for e in watched]
        assert keys == [f"{p}k{i:03d}" for i in range(num_keys)]

    store.run(body, timeout_s=30)


def test_watch_from_compacted_revision_raises(store):
    async def body(s: Store, p: str) -> None:
        old = await s.put(p + "a", b"1")
        latest = await s.put(p + "a", b"2")
        await s.compact(latest)
        await s.compact(old)  # compacting again is a no-op
        watch = s.watch_prefix(p, start_revision=old)
        with pytest.raises(StoreCompacted, match=r"history before revision \d+ has been compacted") as info:
            await watch.__anext__()
        assert info.value.compact_revision == latest
        # From the compaction point on, history is still there.
        assert await take(s.watch_prefix(p, start_revision=latest), 1) == [put_event(p + "a", b"2", latest)]
        with pytest.raises(ValueError, match="revision"):
            await s.compact(latest + 1000)

    store.run(body)


def test_watch_ends_cleanly_when_store_closes(store):
    async def body(s: Store, p: str) -> None:
        start = await next_revision(s, p)
        received: list[WatchEvent] = []
        got_one = asyncio.Event()

        async def consume() -> str:
            async for event in s.watch_prefix(p, start_revision=start):
                received.append(event)
                got_one.set()
            return "ended"

        consumer = asyncio.create_task(consume())
        rev = await s.put(p + "k", b"v")
        await got_one.wait()
        await asyncio.wait_for(s.close(), 3)
        assert await asyncio.wait_for(consumer, 3) == "ended"
        assert received == [put_event(p + "k", b"v", rev)]
        assert s.num_active_watches == 0
        with pytest.raises(StoreError, match="closed"):
            await s.get(p + "k")
        assert [e async for e in s.watch_prefix(p)] == []  # a watch on a closed store is empty

    store.run(body)


def test_cancelled_and_closed_watches_are_released(store):
    async def body(s: Store, p: str) -> None:
        start = await next_revision(s, p)
        by_cancel = s.watch_prefix(p, start_revision=start)
        by_aclose = s.watch_prefix(p, start_revision=start)
        survivor = s.watch_prefix(p, start_revision=start)
        cancelled = asyncio.create_task(take(by_cancel, 10))
        rev1 = await s.put(p + "1", b"")
        assert await take(by_aclose, 1) == [put_event(p + "1", b"", rev1)]
        assert await take(survivor, 1) == [put_event(p + "1", b"", rev1)]
        assert s.num_active_watches == 3
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await by_aclose.aclose()
        assert s.num_active_watches == 1
        rev2 = await s.put(p + "2", b"")
        assert await take(survivor, 1) == [put_event(p + "2", b"", rev2)]
        await survivor.aclose()
        assert s.num_active_watches == 0

    store.run(body)


def test_watch_rejects_nonpositive_start_revision(store):
    async def body(s: Store, p: str) -> None:
        with pytest.raises(ValueError, match="start_revision must be >= 1"):
            s.watch_prefix(p, start_revision=0)

    store.run(body)


# ---- leases ------------------------------------------------------------------------------


def test_lease_expiry_deletes_its_keys_with_delete_events(store):
    async def body(s: Store, p: str) -> None:
        lease = await s.lease_grant(1)
        start = await next_revision(s, p)
        await s.put(p + "b", b"", lease)
        await s.put(p + "a", b"", lease)
        await s.put(p + "keep", b"")
        assert (await s.get(p + "a")).lease == lease
        watch = s.watch_prefix(p, start_revision=start + 3)
        # etcd checks for expired leases every 500 ms, so allow TTL + ~1.5 s.
        events = await take(watch, 2, timeout_s=3.5)
        await watch.aclose()
        expired_at = events[0].mod_revision
        assert events == [delete_event(p + "a", expired_at), delete_event(p + "b", expired_at)]
        assert [kv.key for kv in (await s.get_prefix(p))[0]] == [p + "keep"]
        assert await s.lease_keepalive(lease) == 0

    store.run(body)


def test_keepalive_extends_and_revoke_deletes_at_once(store):
    async def body(s: Store, p: str) -> None:
        lease = await s.lease_grant(1)
        await s.put(p + "k", b"", lease)
        for _ in range(8):  # 2.4 s in all: well past TTL 1 s plus etcd's expiry slack
            await asyncio.sleep(0.3)
            assert await s.lease_keepalive(lease) == 1
        assert (await s.get(p + "k")).lease == lease
        start = await next_revision(s, p)
        watch = s.watch_prefix(p, start_revision=start)
        await s.lease_revoke(lease)
        assert await s.get(p + "k") is None
        assert await take(watch, 1) == [delete_event(p + "k", start)]
        await watch.aclose()

    store.run(body)


def test_dead_lease_keepalive_returns_zero_and_puts_fail(store):
    async def body(s: Store, p: str) -> None:
        lease = await s.lease_grant(5)
        await s.lease_revoke(lease)
        assert await s.lease_keepalive(lease) == 0
        await s.lease_revoke(lease)  # revoking twice is a no-op
        with pytest.raises(LeaseNotFound, match="grant a new lease"):
            await s.put(p + "k", b"", lease)
        with pytest.raises(LeaseNotFound):
            await s.transaction([], [Put(p + "k", b"", lease)])
        assert await s.get(p + "k") is None
        assert await s.lease_keepalive(LeaseId(987654321)) == 0

    store.run(body)


def test_putting_a_key_without_lease_detaches_it(store):
    async def body(s: Store, p: str) -> None:
        lease = await s.lease_grant(5)
        await s.put(p + "k", b"leased", lease)
        await s.put(p + "k", b"free")
        await s.lease_revoke(lease)
        kv = await s.get(p + "k")
        assert (kv.value, kv.lease, kv.version) == (b"free", None, 2)

    store.run(body)


def test_lease_grant_rejects_bad_ttl(store):
    async def body(s: Store, p: str) -> None:
        for ttl in (0, -1, 1.5):
            with pytest.raises(ValueError, match="lease TTL must be a whole number of seconds >= 1"):
                await s.lease_grant(ttl)  # type: ignore[arg-type]

    store.run(body)


def test_concurrent_keepalives_of_many_leases_each_get_their_own_answer(store):
    """A replica renews every worker's lease (etcd: all on one keep-alive stream per member)."""

    async def body(s: Store, p: str) -> None:
        live = [await s.lease_grant(30) for _ in range(20)]
        dead = await s.lease_grant(30)
        await s.lease_revoke(dead)
        leases = live * 3 + [dead] * 3  # the same lease several times at once, too
        answers = await asyncio.gather(*(s.lease_keepalive(lease) for lease in leases))
        assert answers == [30] * len(live) * 3 + [0] * 3
        for lease in live:
            await s.lease_revoke(lease)

    store.run(body)
