"""A bounded waiting room for `batch` requests that admission would reject right now.

Batch requests wait (up to `timeout_s`, asking admission again every `poll_s`) instead of being
rejected, and are shed first when interactive traffic needs the room: an interactive rejection
sheds the oldest waiting batch request, and no waiting batch request is admitted within
`interactive_guard_s` of one. The clock is injected (seconds, monotonic).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

SHED_REASON = "shed to make room for interactive requests"


@dataclass(slots=True)
class Waiter:
    entered_at: float
    shed_reason: str | None = None
    woken: asyncio.Event = field(default_factory=asyncio.Event)


class BatchQueue:
    def __init__(
        self,
        capacity: int,
        timeout_s: float,
        poll_s: float,
        interactive_guard_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = capacity
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.interactive_guard_s = interactive_guard_s
        self._clock = clock
        self._waiters: deque[Waiter] = deque()
        self._last_interactive_reject = -float("inf")

    def __len__(self) -> int:
        return len(self._waiters)

    def enter(self) -> Waiter | None:
        """A place in the queue, or None when it is full."""
        if len(self._waiters) >= self.capacity:
            return None
        waiter = Waiter(entered_at=self._clock())
        self._waiters.append(waiter)
        return waiter

    def leave(self, waiter: Waiter) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def interactive_rejected(self) -> None:
        """Interactive traffic is being turned away: the oldest batch request gives up its place."""
        self._last_interactive_reject = self._clock()
        if self._waiters:
            oldest = self._waiters.popleft()
            oldest.shed_reason = SHED_REASON
            oldest.woken.set()

    def interactive_pressure(self) -> bool:
        return self._clock() - self._last_interactive_reject < self.interactive_guard_s

    def expired(self, waiter: Waiter) -> bool:
        """The waiter has waited longer than timeout_s."""
        return self._clock() - waiter.entered_at > self.timeout_s

    async def wait(self, waiter: Waiter) -> None:
        """Returns when the waiter is shed or poll_s has passed (then the caller re-plans)."""
        try:
            await asyncio.wait_for(waiter.woken.wait(), self.poll_s)
        except TimeoutError:
            pass
