"""The sim engine's step machine: step times from the timing model, deterministic tokens, the
real prefix cache, KV import/export with payload checks, aborts."""

from __future__ import annotations

import pytest

from kvplane.dataplane.engines.events import BlockStored
from kvplane.dataplane.engines.request import EngineCapacityError, EngineInputError, EngineOutput, EngineRequest, SamplingParams
from kvplane.dataplane.engines.sim.config import SimConfig
from kvplane.dataplane.engines.sim.engine import SimEngine
from kvplane.latency import prefill_attention


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(**overrides) -> tuple[SimEngine, Clock]:
    kwargs = dict(model="llama-3-8b", gpu="h100", tp=1, block_size=16, num_blocks=256, payload_bytes=64, max_num_batched_tokens=2048)
    kwargs.update(overrides)
    clock = Clock()
    return SimEngine(SimConfig(**kwargs), clock=clock), clock


def run(engine: SimEngine, clock: Clock) -> list[float]:
    """Steps until idle; returns each step's simulated seconds."""
    steps = []
    while (seconds := engine.begin_step()) is not None:
        clock.now += seconds
        engine.end_step()
        steps.append(seconds)
    return steps


def request(request_id: str, prompt: list[int], max_tokens: int = 4, **kwargs) -> EngineRequest:
    return EngineRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens), **kwargs)


def test_step_times_come_from_the_roofline_and_chunked_prefill_takes_several_steps():
    engine, clock = make()
    outs: list[EngineOutput] = []
    engine.submit(request("a", list(range(1, 3001)), max_tokens=3), outs.append)
    steps = run(engine, clock)
    r = engine.timing
    # 3,000 prompt tokens in chunks of 2,048: two prefill steps (the second one emits token 1), then two decodes.
    expected = [
        r.step_seconds(2048, prefill_attention(2048, 0)),
        r.step_seconds(952, prefill_attention(952, 2048)),
        r.step_seconds(decode_seqs=1, decode_context_tokens=3001),
        r.step_seconds(decode_seqs=1, decode_context_tokens=3002),
    ]
    assert steps == expected
    assert [len(o.new_token_ids) for o in outs] == [1, 1, 1] and outs[-1].finished and outs[-1].finish_reason == "length"
    timings = engine.take_step_timings()
    assert [t.seconds for t in timings] == expected and timings[0].prefill_tokens == 2048
    assert engine.take_step_timings() == []


def test_greedy_tokens_depend_on_the_prompt_and_the_seed_only():
    def tokens(seed: int, prompt: list[int]) -> list[int]:
        engine, clock = make(seed=seed)
        outs: list[EngineOutput] = []
        engine.submit(request("r", prompt, max_tokens=6), outs.append)
        run(engine, clock)
        return [t for o in outs for t in o.new_token_ids]

    a = tokens(0, list(range(1, 100)))
    assert a == tokens(0, list(range(1, 100)))
    assert len(a) == 6 and all(0 <= t < 128256 for t in a)
    assert a != tokens(0, list(range(2, 101)))
    assert a != tokens(1, list(range(1, 100)))


def test_a_greedy_request_resumed_from_its_sent_tokens_goes_on_as_the_first_run():
    """What a migrated stream needs (the control plane resumes it elsewhere from prompt + sent tokens)."""

    def tokens(prompt: list[int], max_tokens: int) -> list[int]:
        engine, clock = make()
        outs: list[EngineOutput] = []
        engine.submit(request("r", prompt, max_tokens=max_tokens), outs.append)
        run(engine, clock)
        return [t for o in outs for t in o.new_token_ids]

    prompt = list(range(1, 40))
    whole = tokens(prompt, 12)
    assert tokens(prompt + whole[:5], 7) == whole[5:]
    assert len(set(whole)) > 6  # a stream, not a repeated token


def test_a_repeated_prompt_hits_the_real_prefix_cache_and_its_blocks_are_published():
    engine, clock = make()
    prompt = list(range(1, 161))  # 10 full blocks
    first: list[EngineOutput] = []
    engine.submit(request("a", prompt, max_tokens=1), first.append)
    first_steps = run(engine, clock)
    stored = [h for e in engine.take_kv_events() if isinstance(e, BlockStored) for h in e.block_hashes]
    assert len(stored) == 10 and first[-1].num_cached_tokens == 0
    second: list[EngineOutput] = []
    engine.submit(request("b", prompt, max_tokens=1), second.append)
    second_steps = run(engine, clock)
    # All but the last block is reused (one token must be computed for logits): 16 tokens computed.
    assert second[-1].num_cached_tokens == 144
    assert engine.take_step_timings()[-1].prefill_tokens == 16
    assert second_steps[0] < first_steps[0]


def test_kv_moves_between_two_sim_engines_with_fingerprint_checks():
    src, src_clock = make()
    dst, dst_clock = make()
    prompt = list(range(1, 101))  # 6 full blocks
    outs: list[EngineOutput] = []
    src.submit(request("p", prompt, prefill_only=True), outs.append)
    run(src, src_clock)
    hashes, pinned = outs[-1].block_hashes, outs[-1].pinned_block_ids
    assert len(hashes) == len(pinned) == 6
    missing = dst.missing_blocks(hashes)
    ids = dst.allocate_for_import(len(missing))
    n = src.pool.block_nbytes
    src_bytes, dst_bytes = src.pool.host_bytes(), dst.pool.host_bytes()
    for i, b in zip(missing, ids):  # what a transport does with the pool's bytes
        dst_bytes[b * n : (b + 1) * n] = src_bytes[pinned[i] * n : (pinned[i] + 1) * n]
    held = dst.commit_import([hashes[i] for i in missing], ids)
    src.unpin(pinned)
    decoded: list[EngineOutput] = []
    dst.submit(request("d", prompt, max_tokens=2, held_block_ids=held), decoded.append)
    run(dst, dst_clock)
    assert decoded[-1].num_cached_tokens == 96  # the pulled prefix, no recompute
    # A transport that delivers the wrong bytes fails the import and frees what it allocated.
    free_before = dst.load().num_free_blocks
    other = dst.allocate_for_import(2)
    dst_bytes[other[0] * n : other[0] * n + n] = bytes(n)
    with pytest.raises(ValueError, match="do not hold the blocks asked for"):
        dst.commit_import([b"\x01" * 16, b"\x02" * 16], other)
    assert dst.load().num_free_blocks == free_before


def test_bad_requests_are_refused_before_queueing_and_aborts_end_streams():
    engine, clock = make(num_blocks=8)
    with pytest.raises(EngineInputError, match="outside the vocabulary"):
        engine.submit(request("x", [1, 2, 200_000]), lambda out: None)
    with pytest.raises(EngineCapacityError, match="pool has only 8"):
        engine.submit(request("y", list(range(1, 200))), lambda out: None)
    outs: list[EngineOutput] = []
    engine.submit(request("z", [1, 2, 3], max_tokens=50), outs.append)
    engine.begin_step()
    engine.end_step()
    engine.abort("z")
    assert engine.begin_step() is None
    assert outs[-1].finish_reason == "abort" and not engine.has_work
    assert engine.load().num_used_blocks == 0


def test_capacity_defaults_to_what_fits_beside_the_weights():
    engine, _ = make(num_blocks=0, model="llama-3-70b", tp=4)
    assert engine.load().num_total_blocks == SimConfig(model="llama-3-70b", tp=4).roofline_model().num_kv_blocks(16) > 20_000
    with pytest.raises(ValueError, match="raise the tensor parallelism"):
        make(model="llama-3-70b", tp=1)
