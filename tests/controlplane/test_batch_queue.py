"""The batch waiting room: bounded, oldest shed first under interactive pressure, timed out by
its own clock (a fake one here: no test waits for time to pass)."""

from __future__ import annotations

import asyncio

from kvplane.controlplane.batch_queue import SHED_REASON, BatchQueue


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_queue_is_bounded_and_sheds_the_oldest_for_interactive_traffic():
    async def body():
        clock = FakeClock()
        queue = BatchQueue(capacity=2, timeout_s=30.0, poll_s=0.05, interactive_guard_s=1.0, clock=clock)
        first, second = queue.enter(), queue.enter()
        assert first is not None and second is not None and len(queue) == 2
        assert queue.enter() is None  # full
        assert not queue.interactive_pressure()
        queue.interactive_rejected()
        assert first.shed_reason == SHED_REASON and first.woken.is_set()
        assert second.shed_reason is None and len(queue) == 1
        clock.now += 0.999
        assert queue.interactive_pressure()
        clock.now += 0.002  # the guard has passed
        assert not queue.interactive_pressure()
        queue.leave(second)
        queue.leave(second)  # leaving twice is harmless
        assert len(queue) == 0

    asyncio.run(body())


def test_a_waiter_expires_after_the_timeout_on_the_queue_clock():
    async def body():
        clock = FakeClock()
        queue = BatchQueue(capacity=1, timeout_s=30.0, poll_s=0.05, clock=clock)
        waiter = queue.enter()
        clock.now += 30.0
        assert not queue.expired(waiter)
        clock.now += 0.001
        assert queue.expired(waiter)

    asyncio.run(body())


def test_wait_returns_when_shed_or_after_one_poll_period():
    async def body():
        queue = BatchQueue(capacity=1, timeout_s=30.0, poll_s=0.01)
        waiter = queue.enter()
        await queue.wait(waiter)  # nobody sheds it: back after one poll period
        assert waiter.shed_reason is None and not waiter.woken.is_set()
        shed_queue = BatchQueue(capacity=1, timeout_s=30.0, poll_s=60.0)
        shed = shed_queue.enter()
        asyncio.get_running_loop().call_soon(shed_queue.interactive_rejected)
        await asyncio.wait_for(shed_queue.wait(shed), timeout=10)  # woken long before its 60 s poll
        assert shed.shed_reason == SHED_REASON

    asyncio.run(body())
