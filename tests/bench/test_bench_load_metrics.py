"""The metric math of `kvplane bench load`, with exact values."""

from __future__ import annotations

import argparse
import json

import pytest

from kvplane.apps.bench.load import (
    ROW_KEYS,
    Objective,
    Outcome,
    format_rows,
    meets_objective,
    objective_from_unloaded,
    parse_floats,
    prediction_error,
    summarize,
    tpot_seconds,
    write_plot,
)

OBJ = Objective(ttft_ms=100.0, tpot_ms=10.0)
OBJECTIVES = {"interactive": OBJ, "batch": Objective(ttft_ms=1000.0, tpot_ms=100.0)}


def test_tpot_is_the_mean_gap_after_the_first_token() -> None:
    assert tpot_seconds(1.0, 1.5, 6) == pytest.approx(0.1)
    assert tpot_seconds(1.0, 1.0, 1) is None
    assert tpot_seconds(1.0, 1.0, 0) is None


@pytest.mark.parametrize(
    ("outcome", "met"),
    [
        (Outcome("interactive", True, ttft_s=0.1, tpot_s=0.01), True),  # both exactly at the objective
        (Outcome("interactive", True, ttft_s=0.1001, tpot_s=0.001), False),
        (Outcome("interactive", True, ttft_s=0.05, tpot_s=0.0101), False),
        (Outcome("interactive", True, ttft_s=0.05, tpot_s=None), True),  # one token: no TPOT to miss
        (Outcome("interactive", False), False),
        (Outcome("interactive", True, ttft_s=0.01, failed=True), False),
    ],
)
def test_meets_objective(outcome: Outcome, met: bool) -> None:
    assert meets_objective(outcome, OBJ) is met


def test_prediction_error_skips_requests_without_a_prediction() -> None:
    assert prediction_error([(110.0, 100.0), (50.0, 100.0), (0.0, 100.0)]) == pytest.approx((0.1 + 0.5) / 2)
    assert prediction_error([(0.0, 100.0)]) is None
    assert prediction_error([]) is None


def test_summarize_counts_goodput_attainment_and_percentiles() -> None:
    outcomes = [
        Outcome("interactive", True, ttft_s=0.050, tpot_s=0.005, num_tokens=8, predicted_ttft_ms=40.0, predicted_tpot_ms=4.0),  # met
        Outcome("interactive", True, ttft_s=0.200, tpot_s=0.020, num_tokens=8, predicted_ttft_ms=100.0),  # both missed
        Outcome("batch", True, ttft_s=0.500, tpot_s=0.050, num_tokens=8),  # met its batch objective
        Outcome("interactive", True, ttft_s=2.0, failed=True),  # deadline: a miss, counted at 2 s
        Outcome("interactive", False),
        Outcome("batch", False),
    ]
    row = summarize(outcomes, duration_s=2.0, objectives=OBJECTIVES)
    assert row == {
        "offered_rps": 3.0, "admitted": 4, "rejected": 2, "goodput_rps": 1.0, "attainment": 0.5,
        "ttft_p50_ms": 350.0, "ttft_p99_ms": pytest.approx(1955.0), "tpot_p50_ms": 20.0, "tpot_p99_ms": pytest.approx(49.4),
        "missed_ttft": 2, "missed_tpot": 1,  # the deadline's miss is TTFT's; a batch objective is its own
        "ttft_prediction_error": pytest.approx((0.2 + 0.5) / 2), "tpot_prediction_error": pytest.approx(0.2),
    }  # fmt: skip
    assert set(row) | {"policy", "load_factor"} == set(ROW_KEYS)


def test_summarize_with_nothing_admitted() -> None:
    row = summarize([Outcome("interactive", False)] * 4, duration_s=4.0, objectives=OBJECTIVES)
    assert (row["offered_rps"], row["admitted"], row["rejected"], row["goodput_rps"]) == (1.0, 0, 4, 0.0)
    assert row["attainment"] is None and row["ttft_p50_ms"] is None and row["ttft_prediction_error"] is None


def test_objectives_are_a_multiple_of_the_unloaded_p90_rounded_up() -> None:
    ttfts = [10.0 * i for i in range(1, 11)]  # p90 = 91
    tpots = [2.0] * 9 + [3.0]  # p90 = 2.1
    assert objective_from_unloaded(ttfts, tpots, 3.0) == Objective(ttft_ms=273.0, tpot_ms=7.0)
    with pytest.raises(ValueError):
        objective_from_unloaded([], tpots, 3.0)


def test_parse_floats() -> None:
    assert parse_floats("0.5,1,1.5", "--rates") == [0.5, 1.0, 1.5]
    for bad in ("", "1,x", "1,-2", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_floats(bad, "--rates")


def _result() -> dict:
    row = {"policy": "none", "load_factor": 1.0, "offered_rps": 2.0, "admitted": 4, "rejected": 0, "goodput_rps": 1.0,
           "attainment": 0.5, "ttft_p50_ms": 12.0, "ttft_p99_ms": 40.0, "tpot_p50_ms": 3.0, "tpot_p99_ms": 5.0,
           "missed_ttft": 1, "missed_tpot": 2, "ttft_prediction_error": None, "tpot_prediction_error": 0.5}  # fmt: skip
    return {"capacity_rps": 2.0, "rows": [row, dict(row, policy="predictive", attainment=None, ttft_prediction_error=0.25)]}


def test_format_rows_is_a_markdown_table() -> None:
    lines = format_rows(_result()).splitlines()
    assert lines[0].startswith("| policy | load | offered/s |")
    assert lines[2] == "| none | 1.00 | 2.00 | 4 | 0 | 1.00 | 50.0% | 12.0 | 40.0 | 3.00 | 5.00 | 1 | 2 | - | 50% |"
    assert lines[3].endswith("| - | 12.0 | 40.0 | 3.00 | 5.00 | 1 | 2 | 25% | 50% |")
    json.dumps(_result())  # the --json shape serialises as is


# matplotlib runs `fc-list` the first time a process lists the system's fonts (no font cache yet,
# as on a fresh machine): a process, so the marker.
@pytest.mark.cluster
def test_write_plot_makes_a_png(tmp_path) -> None:
    path = tmp_path / "sub" / "load.png"
    write_plot(_result(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rows_against_sim_agents_at_a_speedup_are_reported_in_simulated_time() -> None:
    from kvplane.apps.bench.load import in_simulated_time
    from kvplane.types import Objective

    row = {"policy": "none", "load_factor": 1.0, "offered_rps": 2.0, "admitted": 10, "rejected": 0, "goodput_rps": 1.5,
           "attainment": 0.75, "ttft_p50_ms": 100.0, "ttft_p99_ms": None, "tpot_p50_ms": 20.0, "tpot_p99_ms": 40.0,
           "ttft_prediction_error": 0.1}  # fmt: skip
    result, objectives = in_simulated_time({"capacity_rps": 4.0, "rows": [row]}, {"interactive": Objective(300.0, 60.0)}, 0.25)
    (scaled,) = result["rows"]
    assert (scaled["offered_rps"], scaled["goodput_rps"], result["capacity_rps"]) == (8.0, 6.0, 16.0)
    assert (scaled["ttft_p50_ms"], scaled["ttft_p99_ms"], scaled["tpot_p99_ms"]) == (25.0, None, 10.0)
    assert scaled["attainment"] == 0.75 and objectives["interactive"] == Objective(75.0, 15.0)


def test_a_scaled_mix_multiplies_every_token_count() -> None:
    from kvplane.apps.bench.workload import MixConfig

    mix = MixConfig().scaled(8)
    assert mix.system_tokens == (1536, 3072) and mix.output_tokens == (64, 768) and mix.long_user_tokens == (5120, 9216)
    assert mix.validate() is mix and MixConfig().scaled(1) == MixConfig()
