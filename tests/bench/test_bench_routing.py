"""`kvplane bench routing` end to end at a small size: one command, a JSON row per fleet and policy."""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys

import pytest

from kvplane.apps.bench.routing import (
    BLOCK_SIZE,
    HOT_PREFIX_BLOCKS,
    MODEL,
    build_fleet,
    fleet_prompts,
    least_of_passes,
    measure,
    staggered,
)
from kvplane.block_hash import hash_blocks


@pytest.mark.cluster  # runs the CLI in a subprocess
def test_bench_routing_prints_a_row_per_fleet_and_admission_policy():
    argv = ["--workers", "40", "--blocks-per-worker", "100", "--prompt-tokens", "512", "--requests", "8", "--in-flight", "4"]
    argv += ["--warm-up", "0.01", "--json"]
    done = subprocess.run([sys.executable, "-m", "kvplane", "bench", "routing", *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "building spread fleet: 40 workers" in done.stderr  # progress while it runs
    assert "threshold, default: 10 warm-up + 8 requests" in done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert [(r["fleet"], r["admission"]) for r in rows] == [
        ("spread", "threshold"), ("spread", "predictive"), ("hot-prefix", "threshold"), ("hot-prefix", "predictive"),
        ("system-prompt", "threshold"), ("system-prompt", "predictive"),
    ]  # fmt: skip
    for r in rows:
        assert r["workers"] == 40 and r["indexed_blocks"] == 4000
        assert 100 < r["bytes_per_block"] < 2000  # the index's keys, nodes and per-worker sets, per block
        assert 0 < r["p50_ms"] <= r["p99_ms"] and 0 < r["all_priced_p50_ms"] <= r["all_priced_p99_ms"]


def test_hot_prefix_fleet_shares_its_first_blocks_on_every_worker():
    prompts = [[random.Random(i).randrange(32000) for _ in range(2048)] for i in range(3)]
    workers, index = build_fleet(12, 200, "hot-prefix", prompts, random.Random(1))
    assert len(workers) == 12 and all(sum(c.values()) == 200 for c in index.blocks_by_tier().values())
    overlaps = [index.overlaps(hash_blocks(p, BLOCK_SIZE, model_salt=MODEL, tenant_salt="")) for p in prompts]
    assert set().union(*overlaps) == {w.worker_id for w in workers}
    assert all(o.num_blocks == HOT_PREFIX_BLOCKS for by_worker in overlaps for o in by_worker.values())


def test_system_prompt_fleet_holds_the_same_prefix_of_every_prompt_on_every_worker():
    prompts = [[random.Random(i).randrange(32000) for _ in range(2048)] for i in range(3)]
    workers, index = build_fleet(12, 200, "system-prompt", prompts, random.Random(1))
    asked = fleet_prompts("system-prompt", prompts)
    assert [len(p) for p in asked] == [2048] * 3 and asked[1][HOT_PREFIX_BLOCKS * BLOCK_SIZE :] == prompts[1][
        HOT_PREFIX_BLOCKS * BLOCK_SIZE :
    ]
    for p in asked:
        by_worker = index.overlaps(hash_blocks(p, BLOCK_SIZE, model_salt=MODEL, tenant_salt=""))
        assert set(by_worker) == {w.worker_id for w in workers}
        assert {o.num_blocks for o in by_worker.values()} == {HOT_PREFIX_BLOCKS}


@pytest.mark.cluster  # runs the CLI in a subprocess
def test_bench_routing_without_the_baseline_measures_the_default_only():
    argv = ["--workers", "20", "--blocks-per-worker", "50", "--prompt-tokens", "256", "--requests", "5", "--in-flight", "2"]
    argv += ["--warm-up", "0.002", "--fleets", "spread", "--admissions", "threshold", "--no-baseline"]
    done = subprocess.run(
        [sys.executable, "-m", "kvplane", "bench", "routing", *argv, "--json"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "all priced" not in done.stderr and "threshold, default: 2 warm-up + 5 requests" in done.stderr
    [row] = json.loads(done.stdout)["rows"]
    assert row["all_priced_p50_ms"] is None and row["p99_speedup"] is None and 0 < row["p50_ms"] <= row["p99_ms"]
    assert row["bytes_per_block"] > 0

    done = subprocess.run(
        [sys.executable, "-m", "kvplane", "bench", "routing", *argv, "--no-memory", "--json"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"][0]["bytes_per_block"] is None


def test_workers_report_one_at_a_time_in_the_order_the_bench_takes_them():
    # An earlier stagger ran opposite to the reporting order: every worker fell due at once, and
    # the whole fleet reported in one burst per interval instead of one report per request.
    workers, _ = build_fleet(50, 10, "spread", [[1] * 64], random.Random(1))
    due = [w.reported_at + 1.0 for w in staggered(workers, 1000.0, 1.0)]
    assert due == sorted(due) and due[0] == 1000.0
    assert [b - a for a, b in zip(due, due[1:])] == pytest.approx([1.0 / 50] * 49)


def test_passes_over_the_same_requests_make_the_same_decisions():
    # --passes keeps each request's least time over passes: only sound if every pass routes the
    # same requests to the same workers (fresh planner, same draws, an index the passes leave as is).
    args = argparse.Namespace(
        requests=30, in_flight=4, warm_up=0.02, prompt_tokens=512, report_interval=1.0, seed=3, passes=3, blocks_per_worker=50
    )
    prompts = [[random.Random(i).randrange(32000) for _ in range(512)] for i in range(4)]
    workers, index = build_fleet(30, 50, "spread", prompts, random.Random(2))
    first, again = (measure(workers, index, prompts, "predictive", 16, args, random.Random(3)) for _ in range(2))
    assert first[1] == again[1] and len(first[1]) == 30 and any(c is not None for c in first[1])
    least = least_of_passes(workers, index, prompts, "predictive", 16, args)
    assert len(least) == 30 and all(t > 0 for t in least)


@pytest.mark.cluster  # runs the CLI in a subprocess
def test_bench_routing_passes_are_shown_and_checked():
    argv = ["--workers", "20", "--blocks-per-worker", "50", "--prompt-tokens", "256", "--requests", "5", "--in-flight", "2"]
    argv += ["--warm-up", "0.002", "--fleets", "spread", "--admissions", "threshold", "--no-baseline", "--no-memory"]
    run = [sys.executable, "-m", "kvplane", "bench", "routing", *argv]
    done = subprocess.run([*run, "--passes", "2", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "threshold, default: 2 warm-up + 5 requests x 2 passes" in done.stderr
    assert json.loads(done.stdout)["passes"] == 2
    done = subprocess.run([*run, "--passes", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--passes must be at least 1, got 0" in done.stderr
