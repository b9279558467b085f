"""The requests an agent has in flight on an external engine, and the correction of the engine's
lagging load samples."""

from __future__ import annotations

from kvplane.dataplane.engines.external.inflight import InFlight


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_prompt_is_queued_until_the_first_output_then_remaining_tokens_ride():
    inflight = InFlight(block_size=32, clock=Clock())
    inflight.started("a", num_prompt_tokens=70, max_tokens=10)
    inflight.started("b", num_prompt_tokens=30, max_tokens=5)
    assert (inflight.num_waiting, inflight.num_running, inflight.num_queued_prefill_tokens) == (2, 0, 100)
    inflight.progressed("a", 3)
    assert (inflight.num_waiting, inflight.num_running, inflight.num_queued_prefill_tokens) == (1, 1, 30)
    assert inflight.running_remaining_tokens == (7,) and inflight.running_context_tokens == 73


def test_blocks_of_requests_ended_after_a_sample_are_released_from_it():
    clock = Clock()
    inflight = InFlight(block_size=32, clock=clock)
    inflight.started("a", num_prompt_tokens=70, max_tokens=10)
    inflight.progressed("a", 10)  # 80 tokens: 3 blocks
    sample_at = clock.now
    clock.now += 0.1
    inflight.ended("a")
    assert inflight.blocks_released_since(sample_at) == 3
    assert inflight.blocks_released_since(clock.now) == 0  # a later sample no longer counts them
    assert inflight.changed_at == clock.now and len(inflight) == 0
