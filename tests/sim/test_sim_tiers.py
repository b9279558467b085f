"""The sim engine's host and disk tiers (dataplane/engines/sim/tiers.py) in virtual time:
write-through with events per tier, LRU per tier with spills to disk, and a lower-tier hit's copy
overlapped with the request's queue wait and, layer by layer, with its prefill."""

from __future__ import annotations

import pytest

from kvplane.block_hash import hash_blocks
from kvplane.dataplane.engines.events import BlockRemoved, BlockStored
from kvplane.dataplane.engines.request import EngineOutput, EngineRequest, SamplingParams
from kvplane.dataplane.engines.sim.config import SimConfig
from kvplane.dataplane.engines.sim.engine import SimEngine
from kvplane.latency import prefill_attention
from kvplane.types import Tier
from tests.sim.test_sim_engine import Clock

BLOCK_BYTES = 2 * 32 * 8 * 128 * 2 * 16  # llama-3-8b, fp16, 16-token blocks: 2 MiB
GIB_PER_BLOCK = BLOCK_BYTES / 2**30


def make(**overrides) -> tuple[SimEngine, Clock]:
    kwargs = dict(model="llama-3-8b", gpu="h100", tp=1, block_size=16, num_blocks=130, payload_bytes=0, max_num_batched_tokens=2048,
                  host_gib=256 * GIB_PER_BLOCK, host_gb_per_s=10.0)  # fmt: skip
    kwargs.update(overrides)
    clock = Clock()
    return SimEngine(SimConfig(**kwargs), clock=clock), clock


def run(engine: SimEngine, clock: Clock) -> None:
    while (seconds := engine.begin_step()) is not None:
        clock.now += seconds
        engine.end_step()


def submit(engine: SimEngine, request_id: str, prompt: list[int], max_tokens: int = 1) -> list[EngineOutput]:
    outs: list[EngineOutput] = []
    engine.submit(EngineRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens)), outs.append)
    return outs


def hashes(prompt: list[int]) -> list:
    return hash_blocks(prompt, 16, "llama-3-8b")


PROMPT_A = list(range(1, 2002))  # 125 full blocks + 1 token
PROMPT_D = list(range(3000, 5001))  # as long, shares nothing


def by_tier(events) -> list[tuple[str, str, int]]:
    return [(type(e).__name__, e.tier.value, len(e.block_hashes)) for e in events]


def test_config_rejects_bad_tiers_and_states_per_worker_rates():
    with pytest.raises(ValueError, match="host_gib must be a finite number >= 0"):
        SimConfig(host_gib=-1).validate()
    with pytest.raises(ValueError, match="host_gb_per_s must be a positive number"):
        SimConfig(host_gb_per_s=0).validate()
    with pytest.raises(ValueError, match="disk_gib needs host_gib"):
        SimConfig(disk_gib=1).validate()
    with pytest.raises(ValueError, match="holds no KV block"):
        make(host_gib=GIB_PER_BLOCK / 2)
    c = SimConfig(tp=4, host_gib=1, disk_gib=2)
    assert c.host_load_bytes_per_s() == 4 * 50e9 and c.disk_load_bytes_per_s() == 7e9
    assert c.host_blocks() == 2**30 // c.block_nbytes() and c.disk_blocks() == 2 * 2**30 // c.block_nbytes()


def test_write_through_stores_on_host_once_the_copy_ends_with_events_per_tier():
    engine, clock = make()
    submit(engine, "a", PROMPT_A)
    run(engine, clock)
    written_at = clock.now  # the decode step registered nothing new: the 125 blocks were written by the prefill step
    events = engine.take_kv_events()
    assert by_tier(events) == [("BlockStored", "device", 125)]  # the copy to host (125 x 2 MiB at 10 GB/s) is still running
    assert engine.cached_block_hashes_by_tier()[Tier.HOST] == []
    clock.now = written_at + 125 * BLOCK_BYTES / 10e9
    events = engine.take_kv_events()
    assert events == [BlockStored(tuple(hashes(PROMPT_A)), Tier.HOST)]
    assert engine.cached_block_hashes_by_tier()[Tier.HOST] == hashes(PROMPT_A)


def test_host_lru_evicts_the_oldest_and_spills_it_to_disk_which_is_lru_too():
    # Host holds 130 blocks, disk 120: a second prompt of 125 blocks pushes 120 of the first down.
    engine, clock = make(host_gib=130 * GIB_PER_BLOCK, disk_gib=120 * GIB_PER_BLOCK, disk_gb_per_s=1.0)
    submit(engine, "a", PROMPT_A)
    run(engine, clock)
    clock.now += 1.0
    engine.take_kv_events()
    submit(engine, "d", PROMPT_D)
    run(engine, clock)
    clock.now += 0.1  # the copy to host has ended, the 120 blocks' write to disk (0.25 s at 1 GB/s) has not
    a, d = hashes(PROMPT_A), hashes(PROMPT_D)
    events = [e for e in engine.take_kv_events() if e.tier is not Tier.DEVICE]
    assert events == [BlockStored(tuple(d), Tier.HOST), BlockRemoved(tuple(a[:120]), Tier.HOST)]
    clock.now += 0.25
    assert engine.take_kv_events() == [BlockStored(tuple(a[:120]), Tier.DISK)]
    tiers = engine.cached_block_hashes_by_tier()
    assert tiers[Tier.HOST] == a[120:] + d and tiers[Tier.DISK] == a[:120]
    # A third prompt: the host evicts again, and the disk drops its own oldest to fit 120.
    submit(engine, "e", list(range(6000, 6000 + 16 * 10 + 1)))
    run(engine, clock)
    clock.now += 1.0
    events = [e for e in engine.take_kv_events() if e.tier is Tier.DISK]
    assert events == [BlockStored(tuple(a[120:] + d[:5]), Tier.DISK), BlockRemoved(tuple(a[:10]), Tier.DISK)]


def _evict_a_from_device(engine: SimEngine, clock: Clock) -> None:
    submit(engine, "a", PROMPT_A)
    run(engine, clock)
    submit(engine, "d", PROMPT_D)  # 126 blocks of 130: A's tail leaves the device, its head stays
    run(engine, clock)
    clock.now += 1.0  # every copy to host has ended
    engine.take_kv_events()


def test_a_host_hit_at_an_idle_worker_pays_only_what_its_prefill_does_not_hide():
    engine, clock = make()
    _evict_a_from_device(engine, clock)
    on_device = engine.missing_blocks(hashes(PROMPT_A))[0]
    assert 0 < on_device < 125
    num_loaded = 125 - on_device
    copy_s = num_loaded * BLOCK_BYTES / 10e9
    arrived = clock.now
    outs = submit(engine, "b", PROMPT_A)
    # The copy starts at arrival; the prefill may start once the first of 32 layers is in.
    assert engine.begin_step() is None
    first_layer = engine.next_ready_at()
    assert first_layer == pytest.approx(arrived + copy_s / 32)
    clock.now = first_layer
    seconds = engine.begin_step()
    compute = engine.timing.step_seconds(1, prefill_attention(1, 2000))
    # The step ends when the last layer is in plus one layer's compute: the copy is longer than the step.
    assert copy_s > compute
    assert seconds == pytest.approx(copy_s - copy_s / 32 + compute / 32)
    assert engine.take_step_timings()[-1].seconds == compute  # the step-time model is fed the compute alone
    clock.now += seconds
    engine.end_step()
    ttft = clock.now - arrived
    assert ttft == pytest.approx(max(copy_s / 32 + compute, copy_s + compute / 32))
    assert outs[-1].num_cached_tokens == 2000 and outs[-1].num_loaded_tokens == num_loaded * 16
    assert outs[-1].num_disk_loaded_tokens == 0


def test_a_host_hit_queued_behind_other_work_pays_no_load_time():
    engine, clock = make()
    _evict_a_from_device(engine, clock)
    # C holds the worker (its prefill, then 60 decode steps) and the blocks B needs: B waits.
    submit(engine, "c", list(range(7000, 8001)), max_tokens=60)
    first_step = engine.begin_step()
    outs = submit(engine, "b", PROMPT_A)
    on_device = engine.missing_blocks(hashes(PROMPT_A))[0]
    copy_s = (125 - on_device) * BLOCK_BYTES / 10e9
    arrived = clock.now
    clock.now += first_step
    engine.end_step()
    seconds = []
    while (s := engine.begin_step()) is not None:
        seconds.append(s)
        clock.now += s
        engine.end_step()
    timings = engine.take_step_timings()
    assert [t.seconds for t in timings[-len(seconds) :]] == seconds  # no step was stretched
    assert outs[-1].num_loaded_tokens == (125 - on_device) * 16
    assert outs[-1].admitted_at - arrived > copy_s  # the copy ended while B waited


def test_a_disk_hit_waits_for_whole_blocks_and_reports_its_tier():
    engine, clock = make(host_gib=130 * GIB_PER_BLOCK, disk_gib=256 * GIB_PER_BLOCK, disk_gb_per_s=1.0)
    _evict_a_from_device(engine, clock)  # D's 125 blocks on host push 120 of A's down to disk
    clock.now += 1.0
    on_device = engine.missing_blocks(hashes(PROMPT_A))[0]
    tiers = engine.cached_block_hashes_by_tier()
    num_disk = sum(1 for h in hashes(PROMPT_A)[on_device:] if h in set(tiers[Tier.DISK]))
    assert num_disk > 0
    arrived = clock.now
    outs = submit(engine, "b", PROMPT_A)
    assert engine.begin_step() is None
    # A disk block is one file: no layer of it is usable before the drive has read it all.
    assert engine.next_ready_at() == pytest.approx(arrived + num_disk * BLOCK_BYTES / 1e9)
    run_until_idle(engine, clock)
    assert outs[-1].num_disk_loaded_tokens == num_disk * 16
    assert outs[-1].num_loaded_tokens == (125 - on_device) * 16


def run_until_idle(engine: SimEngine, clock: Clock) -> None:
    while engine.has_work:
        seconds = engine.begin_step()
        if seconds is None:
            clock.now = engine.next_ready_at()
            continue
        clock.now += seconds
        engine.end_step()
