"""Arrivals, the synthetic mix, and Mooncake trace parsing, scaling and token synthesis."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from kvplane.apps.bench.workload import (
    MixConfig,
    TraceRecord,
    TraceScale,
    parse_trace,
    poisson_arrivals,
    read_trace,
    scale_length,
    synthesize_prompt,
    synthetic_requests,
    trace_requests,
)


def test_poisson_arrivals_are_seeded_sorted_and_in_the_window() -> None:
    a = poisson_arrivals(5.0, 10.0, random.Random(7))
    assert a == poisson_arrivals(5.0, 10.0, random.Random(7))
    assert a != poisson_arrivals(5.0, 10.0, random.Random(8))
    assert a == sorted(a) and 0 < a[0] and a[-1] < 10.0
    rng = random.Random(1)
    expected = []
    t = rng.expovariate(5.0)
    while t < 10.0:
        expected.append(t)
        t += rng.expovariate(5.0)
    assert poisson_arrivals(5.0, 10.0, random.Random(1)) == expected
    assert poisson_arrivals(0.0, 10.0, random.Random(1)) == [] and poisson_arrivals(1.0, 0.0, random.Random(1)) == []


def test_poisson_rate_and_exponential_gaps() -> None:
    a = poisson_arrivals(20.0, 500.0, random.Random(3))
    assert len(a) / 500.0 == pytest.approx(20.0, rel=0.03)
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert statistics.mean(gaps) == pytest.approx(0.05, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(0.05, rel=0.05)  # exponential: stdev = mean


def test_synthetic_mix_shares_system_prompts_and_varies_lengths() -> None:
    mix = MixConfig()
    requests = synthetic_requests([0.1 * i for i in range(400)], mix, random.Random(0))
    assert requests == synthetic_requests([0.1 * i for i in range(400)], mix, random.Random(0))
    systems = mix.system_prompts()
    assert len(systems) == 3 and systems == MixConfig().system_prompts()
    prefixes = {next(s for s in systems if r.prompt[: len(s)] == s) for r in requests}
    assert prefixes == set(systems)  # every request starts with one of them, and all are used
    user_lengths = [len(r.prompt) - len(next(s for s in systems if r.prompt[: len(s)] == s)) for r in requests]
    long = sum(n >= mix.long_user_tokens[0] for n in user_lengths) / len(requests)
    assert 0.18 < long < 0.32
    outputs = [r.max_tokens for r in requests]
    assert min(outputs) >= 8 and max(outputs) <= 96 and statistics.median(outputs) < 40  # log-uniform: skewed short
    assert {r.priority for r in requests} == {"interactive"}
    assert all(0 <= t < 256 for r in requests for t in r.prompt)
    batch = synthetic_requests([0.0] * 200, MixConfig(batch_fraction=0.5), random.Random(0))
    assert 70 < sum(r.priority == "batch" for r in batch) < 130


def test_mix_validation() -> None:
    with pytest.raises(ValueError, match="output_tokens"):
        MixConfig(output_tokens=(0, 4)).validate()
    with pytest.raises(ValueError, match="long_fraction"):
        MixConfig(long_fraction=1.5).validate()


TRACE = [
    {"timestamp": 1000, "input_length": 1024, "output_length": 64, "hash_ids": [0, 1]},
    {"timestamp": 3000, "input_length": 1500, "output_length": 32, "hash_ids": [0, 1, 2]},
    {"timestamp": 5000, "input_length": 600, "output_length": 10, "hash_ids": [3, 4]},
]


def test_parse_trace() -> None:
    lines = [json.dumps(r) for r in TRACE] + [""]
    records = parse_trace(lines)
    assert records[1] == TraceRecord(timestamp_ms=3000.0, input_length=1500, output_length=32, hash_ids=(0, 1, 2))
    with pytest.raises(ValueError, match="trace line 1"):
        parse_trace(['{"timestamp": 0}'])
    with pytest.raises(ValueError, match="trace line 2"):
        parse_trace([lines[0], "not json"])


def test_read_trace_reads_plain_and_gzip_files_and_the_bundled_trace(tmp_path) -> None:
    import gzip

    text = "\n".join(json.dumps(r) for r in TRACE) + "\n"
    (tmp_path / "t.jsonl").write_text(text)
    with gzip.open(tmp_path / "t.jsonl.gz", "wt") as f:
        f.write(text)
    assert read_trace(tmp_path / "t.jsonl") == read_trace(tmp_path / "t.jsonl.gz") == parse_trace(text.splitlines())
    with pytest.raises(ValueError, match="cannot read trace"):
        read_trace(tmp_path / "missing.jsonl")
    bundled = read_trace()  # the Mooncake conversation trace: one hour, 12,031 requests
    assert len(bundled) == 12031
    assert bundled[-1].timestamp_ms <= 3600 * 1000


def test_trace_scaling_of_lengths_blocks_and_time() -> None:
    records = parse_trace(json.dumps(r) for r in TRACE)
    scale = TraceScale(length_scale=32, speed=2.0)
    assert scale.block_tokens == 16
    assert scale_length(1500, 32) == 47 and scale_length(10, 32) == 1
    requests, clipped = trace_requests(records, scale, max_context=2048)
    assert clipped == 0
    assert [r.arrival_s for r in requests] == [0.0, 1.0, 2.0]  # ms from the first, / 1000, / speed
    assert [len(r.prompt) for r in requests] == [32, 47, 19]
    assert [r.max_tokens for r in requests] == [2, 1, 1]
    assert requests[1].prompt[:32] == requests[0].prompt  # shared hash ids 0, 1 -> the same two blocks
    assert requests[2].prompt[:16] != requests[0].prompt[:16]
    window, _ = trace_requests(records, scale, max_context=2048, duration_s=1.5)
    assert len(window) == 2


def test_trace_prompts_that_do_not_fit_are_clipped_keeping_their_output() -> None:
    records = [TraceRecord(0.0, 3200, 320, (0, 1, 2, 3, 4, 5, 6))]
    requests, clipped = trace_requests(records, TraceScale(length_scale=32), max_context=64)
    assert clipped == 1
    assert (len(requests[0].prompt), requests[0].max_tokens) == (54, 10)


def test_synthesised_blocks_are_equal_exactly_when_hash_ids_are() -> None:
    rng = random.Random(5)
    block = 16
    by_id: dict[int, tuple[int, ...]] = {}
    for _ in range(200):
        ids = [rng.randrange(40) for _ in range(rng.randint(1, 6))]
        prompt = synthesize_prompt(ids, len(ids) * block, block, 256)
        assert len(prompt) == len(ids) * block
        for i, h in enumerate(ids):
            piece = prompt[i * block : (i + 1) * block]
            assert by_id.setdefault(h, piece) == piece  # equal ids -> equal blocks, wherever they appear
    assert len(set(by_id.values())) == len(by_id)  # different ids -> different blocks
    assert synthesize_prompt([1], 16, 16, 256, salt="a") != synthesize_prompt([1], 16, 16, 256, salt="b")


def test_synthesised_prompt_length_truncates_or_extends() -> None:
    short = synthesize_prompt([1, 2], 20, 16, 256)
    assert len(short) == 20 and short[:16] == synthesize_prompt([1], 16, 16, 256)
    long = synthesize_prompt([1], 40, 16, 256)
    assert len(long) == 40 and long[:16] == short[:16]
    assert long[16:32] != synthesize_prompt([2], 16, 16, 256)  # the tail shares nothing with other ids
