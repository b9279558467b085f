"""Helpers for end-to-end tests against real local clusters."""
from __future__ import annotations

import random
import time

import pytest


BLOCK_SIZE = 16  # the engine's default, which these clusters use


def prompt_ids(seed: int, length: int, vocab: int = 256) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Polls `predicate` until it returns a truthy value; fails the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def cached_blocks(client, worker_id: str) -> int:
    for wc in client.cache():
        if wc.worker_id == worker_id:
            return sum(wc.blocks_by_tier.values())
    return 0
