"""A discrete-event loop in virtual time: callbacks ordered by (time, insertion order).

Nothing sleeps and nothing reads a wall clock: `now` jumps to the next event's time. Ties run in
the order they were scheduled, so a run is a pure function of its inputs (and its seeds).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    __slots__ = ("now", "_queue", "_seq", "num_events")

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.num_events = 0

    def __call__(self) -> float:
        """The current virtual time (the loop is also the engines' clock)."""
        return self.now

    def at(self, when: float, callback: Callable[..., Any], *args: Any) -> None:
        if when < self.now:
            raise ValueError(f"cannot schedule at {when} s, before now ({self.now} s)")
        self._seq += 1
        heapq.heappush(self._queue, (when, self._seq, callback, args))

    def after(self, delay: float, callback: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + delay, callback, *args)

    def run(self, until: float | None = None, max_events: int | None = None) -> None:
        """Runs events in order until none is left, the next one is after `until`, or
        `max_events` have run."""
        queue = self._queue
        budget = max_events if max_events is not None else -1
        while queue and budget != 0:
            budget -= 1
            if until is not None and queue[0][0] > until:
                self.now = until
                return
            when, _, callback, args = heapq.heappop(queue)
            self.now = when
            self.num_events += 1
            callback(*args)

    @property
    def pending(self) -> int:
        return len(self._queue)
