"""Host and disk KV tiers: offload on registration, eviction keeps the host copy, loads on a hit,
spill to disk, and disk blocks that outlive the engine."""

from __future__ import annotations

import random

import pytest

from kvplane.dataplane.engines.events import BlockRemoved, BlockStored
from kvplane.types import Tier

from .helpers import generate

BS = 4


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 256) for _ in range(length)]


def _events_by_tier(events):
    stored: dict[Tier, set] = {t: set() for t in Tier}
    removed: dict[Tier, set] = {t: set() for t in Tier}
    for e in events:
        if isinstance(e, BlockStored):
            stored[e.tier].update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            removed[e.tier].update(e.block_hashes)
    return stored, removed


def _evict_device(engine, seeds) -> None:
    """Fills the small device pool with other prompts so earlier blocks are evicted."""
    for s in seeds:
        generate(engine, _prompt(s, 40), max_tokens=2, request_id=f"fill-{s}")


def test_evicted_blocks_are_on_host_and_load_back_with_equal_tokens(make_engine):
    prompt = _prompt(1, 6 * BS + 1)  # 6 full blocks, the last token computed
    reference = generate(make_engine(block_size=BS, num_blocks=24), prompt, max_tokens=8, request_id="ref").token_ids

    engine = make_engine(block_size=BS, num_blocks=24, num_host_blocks=256)
    first = generate(engine, prompt, max_tokens=8, request_id="a")
    assert engine.flush_offload()
    hashes = set(engine.cached_block_hashes_by_tier()[Tier.DEVICE])
    stored, _ = _events_by_tier(engine.take_kv_events())
    assert len(stored[Tier.HOST]) >= 6  # every registered block was copied to the host tier

    _evict_device(engine, range(10, 14))
    assert engine.flush_offload()
    by_tier = engine.cached_block_hashes_by_tier()
    prompt_hashes = [h for h in hashes if h not in by_tier[Tier.DEVICE]]
    assert prompt_hashes, "the fill prompts should have evicted some of the first prompt's blocks"
    assert set(prompt_hashes) <= set(by_tier[Tier.HOST])
    _, removed = _events_by_tier(engine.take_kv_events())
    assert set(prompt_hashes) <= removed[Tier.DEVICE] and not removed[Tier.HOST]

    again = generate(engine, prompt, max_tokens=8, request_id="b")
    final = again.final
    assert final.num_cached_tokens == 6 * BS
    assert final.num_loaded_tokens >= BS  # found below the device pool and copied back
    assert engine.tier_stats().num_loaded_from_host == final.num_loaded_tokens // BS
    assert again.token_ids == first.token_ids == reference
    stored, _ = _events_by_tier(engine.take_kv_events())
    assert set(prompt_hashes) <= stored[Tier.DEVICE]  # the index hears they are back on device


def test_disk_tier_spills_and_survives_a_restart(make_engine, tmp_path):
    disk = tmp_path / "kv"
    prompt = _prompt(2, 8 * BS + 3)
    config = dict(block_size=BS, num_blocks=24, num_host_blocks=4, disk_dir=str(disk), num_disk_blocks=64)
    engine = make_engine(**config)
    first = generate(engine, prompt, max_tokens=6, request_id="a")
    _evict_device(engine, range(20, 23))
    assert engine.flush_offload()
    stored, removed = _events_by_tier(engine.take_kv_events())
    assert stored[Tier.DISK] and stored[Tier.DISK] <= removed[Tier.HOST]  # spilled host -> disk
    on_disk = set(engine.cached_block_hashes_by_tier()[Tier.DISK])
    assert len(list(disk.glob("*.kv"))) == len(on_disk) == engine.tier_stats().num_disk_blocks
    engine.stop()

    restarted = make_engine(**config)
    by_tier = restarted.cached_block_hashes_by_tier()
    assert set(by_tier[Tier.DISK]) == on_disk and by_tier[Tier.DEVICE] == [] and by_tier[Tier.HOST] == []
    again = generate(restarted, prompt, max_tokens=6, request_id="b")
    assert again.final.num_loaded_tokens > 0
    assert restarted.tier_stats().num_loaded_from_disk > 0
    assert again.token_ids == first.token_ids


def test_disk_dir_of_another_layout_is_refused(make_engine, tmp_path):
    make_engine(block_size=BS, num_blocks=24, num_host_blocks=4, disk_dir=str(tmp_path)).stop()
    with pytest.raises(ValueError, match="block_size"):
        make_engine(block_size=8, num_blocks=24, num_host_blocks=4, disk_dir=str(tmp_path))


def test_disk_tier_needs_a_host_tier(make_engine, tmp_path):
    with pytest.raises(ValueError, match="needs a host tier"):
        make_engine(disk_dir=str(tmp_path))
