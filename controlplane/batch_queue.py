"""A bounded waiting room for `batch` requests that admission would reject right now.

Batch requests wait (up to a timeout) instead of being rejected, and are shed first when
interactive traffic needs the room: an interactive rejection sheds the oldest waiting batch
request, and no waiting batch request is admitted within `interactive_guard_s` of one.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class Waiter:
    entered_at: float = field(default_factory=time.monotonic)
    shed_reason: str | None = None
    woken: asyncio.Event = field(default_factory=asyncio.Event)


class BatchQueue:
    def __init__(self, capacity: int, interactive_guard_s: float = 1.0) -> None:
        self.capacity = capacity
        self.interactive_guard_s = interactive_guard_s
        self._waiters: deque[Waiter] = deque()
        self._last_interactive_reject = -float("inf")

    def __len__(self) -> int:
        return len(self._waiters)

    def enter(self) -> Waiter | None:
        """A place in the queue, or None when it is full."""
        if len(self._waiters) >= self.capacity:
            return None
        waiter = Waiter()
        self._waiters.append(waiter)
        return waiter

    def leave(self, waiter: Waiter) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def interactive_rejected(self) -> None:
        """Interactive traffic is being turned away: the oldest batch request gives up its place."""
        self._last_interactive_reject = time.monotonic()
        if self._waiters:
            oldest = self._waiters.popleft()
            oldest.shed_reason = "shed to make room for interactive requests"
            oldest.woken.set()

    def interactive_pressure(self) -> bool:
        return time.monotonic() - self._last_interactive_reject < self.interactive_guard_s

    async def wait(self, waiter: Waiter, seconds: float) -> None:
        """Sleeps until shed or `seconds` pass (then the caller re-plans)."""
        try:
            await asyncio.wait_for(waiter.woken.wait(), seconds)
        except asyncio.TimeoutError:
            pass
