"""The batch waiting room: bounded, oldest shed first under interactive pressure."""
from __future__ import annotations

import asyncio

from controlplane.batch_queue import BatchQueue


def test_queue_is_bounded_and_sheds_the_oldest_for_interactive_traffic():
    async def body():
        queue = BatchQueue(capacity=2, interactive_guard_s=0.2)
        first, second = queue.enter(), queue.enter()
        assert first is not None and second is not None and len(queue) == 2
        assert queue.enter() is None  # full
        assert not queue.interactive_pressure()
        queue.interactive_rejected()
        assert first.shed_reason == "shed to make room for interactive requests" and first.woken.is_set()
        assert second.shed_reason is None and len(queue) == 1
        assert queue.interactive_pressure()
        await asyncio.sleep(0.25)
        assert not queue.interactive_pressure()
        queue.leave(second)
        queue.leave(second)  # leaving twice is harmless
        assert len(queue) == 0

    asyncio.run(body())


def test_wait_returns_on_shedding_or_after_the_poll_interval():
    async def body():
        queue = BatchQueue(capacity=1)
        waiter = queue.enter()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await queue.wait(waiter, 0.05)
        assert waiter.shed_reason is None and loop.time() - started >= 0.05
        loop.call_later(0.01, queue.interactive_rejected)
        await queue.wait(waiter, 5.0)
        assert waiter.shed_reason is not None

    asyncio.run(body())
