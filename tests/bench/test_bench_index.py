"""`kvplane bench index` at a small size, in process: a row per way of applying a worker's state,
and the events and the periodic snapshots leave the same index (the bench checks and fails if not)."""

from __future__ import annotations

import argparse
import json

from kvplane.apps.bench import index as bench


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    code = bench.run(parser.parse_args(list(argv)))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_bench_index_prints_a_row_per_way_of_applying_a_workers_state(capsys):
    code, out, err = _run(capsys, "--workers", "3", "--blocks", "600", "--turnover", "0.05", "--rounds", "2", "--json")
    assert code == 0, err
    assert "registering 3 workers x 600 blocks" in err and "round 2/2: 30 blocks turned over" in err  # progress
    report = json.loads(out)
    rows = {r["what"]: r for r in report["rows"]}
    assert list(rows) == ["first snapshot (registration)", "events of the turnover", "periodic snapshot"]
    assert [rows[w]["count"] for w in rows] == [3, 6, 6]
    assert rows["events of the turnover"]["blocks"] == 60 and rows["periodic snapshot"]["blocks"] == 600
    assert rows["first snapshot (registration)"]["ratio_to_first"] == 1.0
    assert rows["periodic snapshot"]["cores_at_1000_workers"] > 0
    for r in rows.values():
        assert 0 < r["p50_ms"] <= r["p99_ms"]


def test_bench_index_refuses_a_turnover_outside_0_to_1(capsys):
    code, _, err = _run(capsys, "--turnover", "1.5")
    assert code == 2 and "0 < --turnover <= 1" in err
