"""`kvplane bench prefix` without a cluster: seeded workloads, trace scaling, the oracle, the table."""

from __future__ import annotations

import json

from kvplane.apps.bench import prefix, workloads


def test_workloads_are_seeded_and_sized_as_documented():
    assert workloads.chat(0) == workloads.chat(0) and workloads.chat(0) != workloads.chat(1)
    sizes = {name: len(getattr(workloads, name)(0)) for name in ("chat", "agent", "rag")}
    assert sizes == {"chat": 16 * 6, "agent": 24 * 5, "rag": 120}
    agent = workloads.agent(0)
    # Tasks of one agent type share their 640-token system prompt; steps extend their task.
    assert agent[0].prompt[:640] == agent[20].prompt[:640] and agent[0].prompt[:640] != agent[5].prompt[:640]
    assert agent[1].prompt[: len(agent[0].prompt)] == agent[0].prompt and agent[1].after == 0


def test_trace_replay_scales_lengths_blocks_and_time(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 2048, "output_length": 320, "hash_ids": [0, 1, 2, 3]},
        {"timestamp": 4000, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 7]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    a, b = workloads.trace(path, token_scale=32, time_scale=4.0)
    assert (len(a.prompt), a.max_tokens, a.arrival_s) == (64, 10, 0.0)
    assert (len(b.prompt), b.max_tokens, b.arrival_s) == (34, 1, 1.0)
    assert a.prompt[:32] == b.prompt[:32] and a.prompt[32:34] != b.prompt[32:34]  # equal ids, equal blocks


def test_oracle_counts_the_longest_pooled_prefix_and_keeps_the_last_token():
    base = tuple(range(1, 65))  # 4 blocks
    reqs = [workloads.BenchRequest(0, base, 1), workloads.BenchRequest(1, base, 1), workloads.BenchRequest(2, base + (9,) * 16, 1)]
    # second: 3 of 4 blocks (the last token is computed); third: all 4 of 5 blocks.
    assert prefix.oracle_hit_rate(reqs, capacity_blocks=100) == (48 + 64) / (64 + 64 + 80)
    assert prefix.oracle_hit_rate(reqs, capacity_blocks=1) == 0.0


def test_json_rows_have_exactly_the_documented_keys():
    row = {k: 0 for k in prefix.JSON_KEYS} | {"workload": "chat", "policy": "kvplane", "requests": 1, "failed": 0, "fetches": 0}
    out = json.loads(prefix.to_json([row]))
    assert list(out) == ["rows"] and list(out["rows"][0]) == list(prefix.JSON_KEYS)
    assert list(prefix.JSON_KEYS) == [
        "workload",
        "policy",
        "hit_rate",
        "oracle_hit_rate",
        "prefill_tokens",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "throughput_tok_s",
        "max_load_over_mean",
    ]
