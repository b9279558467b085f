"""Noticing that this process itself was paused (SIGSTOP, a frozen VM, a long GC), so that the
time it lost is not blamed on others.

A frozen replica wakes up with every timer expired at once: each relay it was running believes its
worker stalled, and every worker's load report looks old. A ticker on the event loop measures the
gaps between its ticks; a gap well above the tick is a pause of this process. Callers ask whether
a pause ended after a moment they care about (`paused_since`), and the cluster view stops judging
silence until the store has been heard from again after the pause.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

TICK_S = 0.1
PAUSE_S = 0.75  # a tick this late means the process was not running


class PauseDetector:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.last_pause_end = float("-inf")  # when the latest pause ended (monotonic s)
        self.num_pauses = 0
        self._task: asyncio.Task | None = None
        self._last_tick = self._clock()
        self.on_pause: list[Callable[[float], None]] = []  # called with the pause's length

    def start(self) -> None:
        self._last_tick = self._clock()
        self._task = asyncio.create_task(self._tick(), name="pause-detector")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def paused_since(self, moment: float) -> bool:
        """True when a pause of this process ended after `moment` (monotonic s), or one is ending
        now: a tick overdue by PAUSE_S means the loop has just woken, and its expired timers (a
        relay's progress timer, say) run a turn before the ticker notices."""
        overdue = self._task is not None and self._clock() - self._last_tick > PAUSE_S
        return self.last_pause_end > moment or overdue

    def observe(self, gap_s: float) -> None:
        """One tick came `gap_s` after the previous one (the ticker calls this; tests may too)."""
        if gap_s > PAUSE_S:
            self.last_pause_end = self._clock()
            self.num_pauses += 1
            log.warning("this process did not run for %.1f s (paused?); not blaming workers for it", gap_s)
            for listener in self.on_pause:
                listener(gap_s)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            now = self._clock()
            self.observe(now - self._last_tick)
            self._last_tick = now
