"""Step timings: every step's measured duration with its features, and the load detail that
admission predicts from (remaining tokens and context of the running requests)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import kvplane.dataplane.engines.reference.engine as engine_module
from kvplane.dataplane.engines import EngineOutput, EngineRequest, SamplingParams
from kvplane.dataplane.engines.reference import Engine
from kvplane.latency import StepSample, prefill_attention

from .helpers import generate, submit


def features(s: StepSample) -> tuple[int, int, int, int]:
    return s.prefill_tokens, s.prefill_attention, s.decode_seqs, s.decode_context_tokens


def test_a_prefill_alone_is_one_step_with_its_attention_work(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    generate(engine, list(range(1, 11)), max_tokens=1)
    timings = engine.take_step_timings()
    assert [features(s) for s in timings] == [(10, 50, 0, 0)]
    assert 0 < timings[0].seconds < 5
    assert engine.take_step_timings() == []  # taken once


def test_a_long_prompt_prefills_in_chunks_with_growing_context(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(max_num_batched_tokens=256, num_blocks=128, max_tokens_limit=8)
    generate(engine, [7] * 300, max_tokens=1)
    assert [features(s) for s in engine.take_step_timings()] == [
        (256, prefill_attention(256, 0), 0, 0),
        (44, prefill_attention(44, 256), 0, 0),
    ]


def test_decode_steps_count_sequences_and_their_context(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(start=False)
    a = submit(engine, EngineRequest("a", [3] * 5, SamplingParams(max_tokens=4)))
    b = submit(engine, EngineRequest("b", [4] * 7, SamplingParams(max_tokens=4)))
    engine.start()
    assert a.final.finish_reason == b.final.finish_reason == "length"
    assert [features(s) for s in engine.take_step_timings()] == [
        (12, prefill_attention(5, 0) + prefill_attention(7, 0), 0, 0),  # both prompts in one step
        (0, 0, 2, 6 + 8),  # each decode attends over its prompt and the tokens so far
        (0, 0, 2, 7 + 9),
        (0, 0, 2, 8 + 10),
    ]


def test_a_cached_prefix_is_context_for_the_new_tokens(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()  # block_size 4
    prompt = list(range(20, 32))
    generate(engine, prompt, max_tokens=1, request_id="first")
    engine.take_step_timings()
    out = generate(engine, prompt + [1, 2, 3, 4], max_tokens=1, request_id="second").final
    assert out.num_cached_tokens == 12
    assert [features(s) for s in engine.take_step_timings()] == [(4, prefill_attention(4, 12), 0, 0)]


def test_untaken_timings_are_bounded_and_keep_the_newest(make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "MAX_QUEUED_STEP_TIMINGS", 3)
    engine = make_engine()
    generate(engine, [5] * 3, max_tokens=6)  # 6 steps: a prefill, then 5 decodes over 4..8 tokens
    timings = engine.take_step_timings()
    assert [features(s) for s in timings] == [(0, 0, 1, 6), (0, 0, 1, 7), (0, 0, 1, 8)]


def test_load_reports_remaining_tokens_and_context_of_running_requests(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    first_token, release = threading.Event(), threading.Event()

    def blocking_sink(out: EngineOutput) -> None:
        first_token.set()
        release.wait(10)  # holds the step thread after the first token

    engine.submit(EngineRequest("a", [9] * 5, SamplingParams(max_tokens=10)), blocking_sink)
    assert first_token.wait(10)
    try:
        load = engine.load()
        assert load.running_remaining_tokens == (9,)
        assert load.running_context_tokens == 6
    finally:
        release.set()
    engine.stop()
    assert engine.load().running_remaining_tokens == ()
