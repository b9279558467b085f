"""Tier loads off the engine step: a decode keeps stepping while another request's host -> device
copy is held, a request cancelled mid-load frees its blocks, and tokens are the same whether loads
run on the copy thread or inside the step (sync_tier_loads, the old path).

The copy is held by an Event the test controls (wrapped around TierStore._load_block, the one
place a host block is copied into the device pool), so nothing here depends on timing.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from kvplane.dataplane.engines import EngineRequest, SamplingParams
from kvplane.types import Tier

from .helpers import generate, submit

BS = 4
PROMPT_BLOCKS = 6


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 256) for _ in range(length)]


def _wait_for(predicate, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _engine_with_prefix_on_host(make_engine, **overrides):
    """An engine whose host tier holds the prompt's blocks and whose device pool lost some of them."""
    engine = make_engine(block_size=BS, num_blocks=24, num_host_blocks=256, **overrides)
    prompt = _prompt(1, PROMPT_BLOCKS * BS + 1)
    first = generate(engine, prompt, max_tokens=8, request_id="first")
    for s in range(10, 14):  # other prompts fill the small device pool and evict the prompt's blocks
        generate(engine, _prompt(s, 40), max_tokens=2, request_id=f"fill-{s}")
    assert engine.flush_offload()
    hashes = engine.prompt_block_hashes(prompt)
    by_tier = engine.cached_block_hashes_by_tier()
    assert set(hashes) <= set(by_tier[Tier.HOST])
    assert not set(hashes) <= set(by_tier[Tier.DEVICE]), "the fill prompts should have evicted some blocks"
    return engine, prompt, first.token_ids


class CopyGate:
    """Holds every host -> device block copy until released; tells when one is waiting."""

    def __init__(self, tiers, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        copy = tiers._load_block

        def gated(src, block_id):
            self.entered.set()
            assert self.release.wait(30), "the test never released the copy"
            copy(src, block_id)

        monkeypatch.setattr(tiers, "_load_block", gated)


def test_a_decode_keeps_stepping_while_another_request_loads(make_engine, monkeypatch) -> None:
    engine, prompt, expected = _engine_with_prefix_on_host(make_engine)
    stream = submit(engine, EngineRequest("stream", _prompt(2, 5), SamplingParams(max_tokens=30, ignore_eos=True)))
    _wait_for(lambda: len(stream.token_ids) >= 2, "the stream's first tokens")

    gate = CopyGate(engine._tiers, monkeypatch)
    loader = submit(engine, EngineRequest("loader", prompt, SamplingParams(max_tokens=8)))
    assert gate.entered.wait(20), "the loader's copy never started"
    held_at = len(stream.token_ids)
    # The copy is held: the stream still gets tokens, and the loader is not in the batch.
    _wait_for(lambda: len(stream.token_ids) >= held_at + 5, "stream tokens while the load is held")
    assert loader.outputs == []
    assert engine.load().num_running == 2  # the loading request holds its seat

    gate.release.set()
    final = loader.final
    assert final.finish_reason == "length" and final.num_loaded_tokens > 0
    assert loader.token_ids == expected
    assert stream.final.finish_reason == "length" and len(stream.token_ids) == 30


def test_a_request_cancelled_mid_load_frees_its_blocks(make_engine, monkeypatch) -> None:
    engine, prompt, _ = _engine_with_prefix_on_host(make_engine)
    free_before = engine.load().num_free_blocks
    gate = CopyGate(engine._tiers, monkeypatch)
    loader = submit(engine, EngineRequest("loader", prompt, SamplingParams(max_tokens=8)))
    assert gate.entered.wait(20), "the loader's copy never started"

    engine.abort("loader")
    final = loader.final  # the abort is answered while the copy is still held
    assert final.finish_reason == "abort" and loader.token_ids == []
    # The copy may still write the blocks: they stay out of the pool until it stops.
    assert engine.load().num_free_blocks < free_before

    gate.release.set()
    _wait_for(lambda: engine.load().num_free_blocks == free_before, "the cancelled load's blocks back in the pool")
    load = engine.load()
    assert (load.num_running, load.num_waiting, load.num_used_blocks) == (0, 0, 0)
    assert engine.tier_stats().num_loaded_from_host <= 1  # stopped after the block in flight
    # The engine serves on, and the prefix still loads for the next request.
    again = generate(engine, prompt, max_tokens=4, request_id="again")
    assert again.final.num_loaded_tokens > 0


@pytest.mark.parametrize("sync_tier_loads", [False, True], ids=["copy-thread", "in-step"])
def test_tokens_are_the_same_with_and_without_async_loads(make_engine, sync_tier_loads: bool) -> None:
    engine, prompt, expected = _engine_with_prefix_on_host(make_engine, sync_tier_loads=sync_tier_loads)
    events_before = engine.take_kv_events()
    assert events_before  # drained, so the loader's events stand alone below
    loaded = generate(engine, prompt, max_tokens=8, request_id="loaded")
    assert loaded.final.num_loaded_tokens > 0
    assert loaded.token_ids == expected
    # The loaded blocks are announced on the device tier as before.
    stored = {h for e in engine.take_kv_events() if getattr(e, "tier", None) == Tier.DEVICE for h in getattr(e, "block_hashes", ())}
    num_loaded_blocks = loaded.final.num_loaded_tokens // BS
    hashes = engine.prompt_block_hashes(prompt)
    first_loaded = loaded.final.num_cached_tokens // BS - num_loaded_blocks
    assert set(hashes[first_loaded : first_loaded + num_loaded_blocks]) <= stored
