"""Pause detection: a tick far later than its period means this process itself did not run."""

from __future__ import annotations

from kvplane.controlplane.pause import PAUSE_S, TICK_S, PauseDetector


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_late_tick_is_a_pause_that_ends_now():
    clock = Clock()
    detector = PauseDetector(clock)
    heard: list[float] = []
    detector.on_pause.append(heard.append)
    detector.observe(TICK_S * 1.5)  # a slow tick on a busy machine is not a pause
    assert detector.num_pauses == 0 and not detector.paused_since(0.0)
    clock.now = 130.0
    detector.observe(PAUSE_S + 4.0)
    assert detector.num_pauses == 1 and heard == [PAUSE_S + 4.0]
    assert detector.paused_since(129.0) and not detector.paused_since(130.0)
