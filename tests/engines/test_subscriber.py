"""The KV-event subscriber against a publisher on real ZMQ sockets: live batches, a lost batch
recovered by replay, history gone from the replay buffer (resync: forget, flush the engine),
an engine restart, and start-up beside an engine that already holds blocks."""

from __future__ import annotations

import asyncio
import time

from kvplane.block_hash import hash_blocks
from kvplane.dataplane.engines.events import AllCleared, BlockRemoved, BlockStored
from kvplane.dataplane.engines.external.hash_map import BlockHashMapper
from kvplane.dataplane.engines.external.subscriber import KVEventSubscriber
from kvplane.types import Tier
from tests.engines.kv_publisher import Publisher, removed, stored

TOKENS = list(range(40))
H = hash_blocks(TOKENS, 4, "m")


async def until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def block(i: int) -> dict:
    return stored([1000 + i], TOKENS[4 * i : 4 * i + 4], parent=None if i == 0 else 1000 + i - 1)


async def connected(publisher: Publisher, **kwargs) -> KVEventSubscriber:
    flushes = kwargs.pop("flushes", None)

    async def flush() -> bool:
        flushes.append(time.monotonic())
        return True

    sub = KVEventSubscriber(publisher.endpoint, BlockHashMapper("m", 4), flush=flush if flushes is not None else None, **kwargs)
    await sub.start()
    # ZMQ drops what is published before a subscription reaches the publisher: wait until one does.
    probe = 0
    while sub.num_batches == 0:
        publisher.publish([])
        probe += 1
        await asyncio.sleep(0.05)
        assert probe < 100, "the subscription never took hold"
    return sub


def test_live_batches_and_a_lost_batch_recovered_by_replay():
    async def run():
        pub = Publisher()
        sub = await connected(pub, replay_endpoint=pub.replay_endpoint)
        try:
            sub.take_events()
            before = (sub.num_gaps, sub.num_replayed, sub.num_resyncs)
            pub.publish([block(0)])
            pub.publish([block(1)], lost=True)  # ZMQ dropped it (slow subscriber)
            pub.publish([block(2)])
            await until(lambda: sub.mapper.num_held() == 3)
            # One gap, filled by the replay (which also carries the batch that revealed it), no resync.
            assert (sub.num_gaps, sub.num_resyncs) == (before[0] + 1, before[2]) and sub.num_replayed > before[1]
            assert pub.replay_requests[-1] == sub.next_seq - 2  # asked from the first missing batch
            events = sub.take_events()
            assert events == [BlockStored((H[0],), Tier.DEVICE), BlockStored((H[1],), Tier.DEVICE), BlockStored((H[2],), Tier.DEVICE)]
            pub.publish([removed([1002])])
            await until(lambda: sub.mapper.num_held() == 2)
            assert sub.take_events() == [BlockRemoved((H[2],), Tier.DEVICE)]
        finally:
            await sub.stop()
            pub.close()

    asyncio.run(run())


def test_history_gone_from_the_replay_buffer_resyncs_and_flushes_the_engine():
    async def run():
        pub = Publisher(buffer_steps=2)
        flushes: list[float] = []
        sub = await connected(pub, replay_endpoint=pub.replay_endpoint, flushes=flushes)
        try:
            pub.publish([block(0)])
            await until(lambda: sub.mapper.num_held() == 1)
            sub.take_events()
            resyncs, num_flushes = sub.num_resyncs, len(flushes)
            for i in (1, 2, 3):
                pub.publish([block(i)], lost=True)  # three lost, the buffer keeps two
            pub.publish([stored([7], [9, 9, 9, 9])])
            await until(lambda: sub.num_resyncs == resyncs + 1)
            await until(lambda: sub.mapper.num_held() >= 1)
            assert len(flushes) == num_flushes + 1
            events = sub.take_events()
            # Forgotten first: the index drops what it cannot vouch for ...
            assert events[0] == AllCleared()
            # ... then what the buffer still had is applied: blocks 2 and 3 chain on block 1,
            # lost for good, so they cannot be mapped (counted); the new root block maps.
            assert BlockStored((H[2],), Tier.DEVICE) not in events and BlockStored((H[3],), Tier.DEVICE) not in events
            assert sub.mapper.num_unmapped_blocks >= 1
            assert BlockStored((hash_blocks([9, 9, 9, 9], 4, "m")[0],), Tier.DEVICE) in events
        finally:
            await sub.stop()
            pub.close()

    asyncio.run(run())


def test_without_a_replay_endpoint_a_gap_resyncs_at_once():
    async def run():
        pub = Publisher()
        sub = await connected(pub)
        try:
            pub.publish([block(0)])
            await until(lambda: sub.mapper.num_held() == 1)
            sub.take_events()
            resyncs = sub.num_resyncs  # probes lost before the subscription took hold resync too
            pub.publish([block(1)], lost=True)
            pub.publish([stored([9], [5, 5, 5, 5])])
            await until(lambda: sub.num_resyncs == resyncs + 1 and sub.mapper.num_held() == 1)
            assert sub.take_events() == [AllCleared(), BlockStored((hash_blocks([5, 5, 5, 5], 4, "m")[0],), Tier.DEVICE)]
            assert pub.replay_requests == []
        finally:
            await sub.stop()
            pub.close()

    asyncio.run(run())


def test_an_engine_restart_forgets_its_cache():
    async def run():
        pub = Publisher()
        sub = await connected(pub, replay_endpoint=pub.replay_endpoint)
        try:
            pub.publish([block(0)])
            pub.publish([block(1)])
            await until(lambda: sub.mapper.num_held() == 2)
            sub.take_events()
            pub.restart()
            pub.publish([stored([1000], TOKENS[:4])], ts=time.time() + 1)
            await until(lambda: sub.num_restarts == 1)
            await until(lambda: sub.mapper.num_held() == 1)
            assert sub.take_events() == [AllCleared(), BlockStored((H[0],), Tier.DEVICE)]
        finally:
            await sub.stop()
            pub.close()

    asyncio.run(run())


def test_start_up_beside_a_running_engine_replays_what_it_holds():
    async def run():
        pub = Publisher()
        for i in range(3):
            pub.publish([block(i)])  # before any subscriber: lost to the live stream
        sub = KVEventSubscriber(pub.endpoint, BlockHashMapper("m", 4), replay_endpoint=pub.replay_endpoint)
        await sub.start()
        try:
            assert pub.replay_requests == [0] and sub.next_seq == 3
            assert sub.mapper.snapshot() == {Tier.DEVICE: H[:3]}
            assert sub.num_resyncs == 0
        finally:
            await sub.stop()
            pub.close()

    asyncio.run(run())
