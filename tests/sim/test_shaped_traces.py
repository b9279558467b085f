"""The traces of other shapes (kvplane/apps/sim/shaped_traces.py): Mooncake's format as the
trace reader takes it, the same files for the same seed, and each shape as its docstring says."""

from __future__ import annotations

import math

from kvplane.apps.bench.workload import read_trace
from kvplane.apps.sim import shaped_traces


def infinite_cache_hit(records) -> float:
    """The share of blocks an unbounded cache holds when they arrive (the README's 36.6 % for the bundled trace)."""
    seen, hits, total = set(), 0, 0
    for r in records:
        for position, block in enumerate(r.hash_ids):
            hits += (position, block) in seen
            seen.add((position, block))
            total += 1
    return hits / total


def test_each_shape_is_a_mooncake_trace_drawn_again_alike_from_its_seed(tmp_path):
    paths = shaped_traces.write(tmp_path / "a", seed=0)
    assert sorted(paths) == ["bimodal", "code", "longdoc", "toolagent"]
    again = shaped_traces.write(tmp_path / "b", seed=0)
    other = shaped_traces.write(tmp_path / "c", seed=1)
    hit = {}
    for name, path in paths.items():
        records = read_trace(path)
        assert len(records) > 500
        assert [r.timestamp_ms for r in records] == sorted(r.timestamp_ms for r in records)
        # As the bundled trace: a block id per 512 tokens, the last one partly filled.
        assert all(len(r.hash_ids) == math.ceil(r.input_length / 512) and r.output_length > 0 for r in records)
        assert path.read_bytes() == again[name].read_bytes() != other[name].read_bytes()
        hit[name] = infinite_cache_hit(records)
    # Agents reuse their tools and history, code and long documents rarely repeat a prefix.
    assert hit["toolagent"] > 0.7 and hit["code"] < 0.3 and hit["longdoc"] < 0.3
    long_prompts = [r.input_length for r in read_trace(paths["longdoc"])]
    assert min(long_prompts) > 7000 and max(long_prompts) <= 65 * 512
    bimodal = [r.input_length for r in read_trace(paths["bimodal"])]
    assert not any(800 < n < 6000 for n in bimodal) and 0.6 < sum(n <= 800 for n in bimodal) / len(bimodal) < 0.8


def test_the_command_writes_the_four_files_and_says_what_they_hold(tmp_path, capsys):
    assert shaped_traces.main([str(tmp_path), "--seed", "3"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bimodal.jsonl", "code.jsonl", "longdoc.jsonl", "toolagent.jsonl"]
    assert capsys.readouterr().out.count("requests over") == 4
