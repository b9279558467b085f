"""`kvplane sim --grid`: the decision grid on a tiny subset, and its verdicts on hand-made rows."""

from __future__ import annotations

import argparse

import pytest

from kvplane.apps.sim import grid
from kvplane.apps.sim import main as sim_main

TINY = (
    "--grid", "--grid-groups", "chat,synthetic", "--requests", "12", "--compare-routing", "kvplane,sglang,llm-d",
    "--capacity-concurrency", "4", "--duration", "2", "--sim-model", "llama-3-8b", "--sim-tp", "1",
)  # fmt: skip


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sim_main.add_arguments(parser)
    return parser.parse_args(list(argv))


# It plots (--plot), and matplotlib runs `fc-list` the first time a process lists the system's
# fonts (no font cache yet, as on a fresh machine): a process, so the marker.
@pytest.mark.cluster
def test_a_tiny_grid_runs_every_policy_on_every_cell_and_judges_kvplane(capsys, tmp_path):
    logged: list[str] = []
    results = grid.run_grid(parse(*TINY), logged.append)
    chat, synthetic = results
    assert [r.group.name for r in results] == ["chat", "synthetic"]
    # chat: 3 speeds x 3 policies; synthetic: 3 load factors x (3 policies + kvplane/predictive).
    assert [(r["level"], r["routing"], r["admission"]) for r in chat.rows[:3]] == [
        ("chat x1", "kvplane", "none"), ("chat x1", "sglang", "none"), ("chat x1", "llm-d", "none"),
    ]  # fmt: skip
    assert len(chat.rows) == 9 and len(synthetic.rows) == 12
    assert [r["routing"] + "/" + r["admission"] for r in synthetic.rows[:4]] == [
        "kvplane/none",
        "sglang/none",
        "llm-d/none",
        "kvplane/predictive",
    ]
    # --requests caps every level (2 s of synthetic arrivals may bring fewer); nothing fails.
    assert all(r["requests"] == 12 for r in chat.rows) and all(0 < r["requests"] <= 12 for r in synthetic.rows)
    assert all(r["failed"] == 0 for r in chat.rows + synthetic.rows)
    # Progress went out while it ran: one line per group and per run.
    assert sum(line.startswith("[grid 1/2] chat") for line in logged) == 1
    assert sum("[grid 2/2 synthetic run " in line for line in logged) == 12
    # Each verdict restates the rows it compares.
    for v in chat.verdicts:
        level = [r for r in chat.rows if r["level"] == v.level]
        kv = next(r for r in level if r["routing"] == "kvplane")
        peers = [r for r in level if r["routing"] in ("sglang", "llm-d")]
        if v.target.startswith("TTFT"):
            assert v.reference == min(p["ttft_p99_ms"] for p in peers)
            assert v.met == (kv["ttft_p99_ms"] <= 1.02 * v.reference)
        elif v.target.startswith("goodput"):
            assert v.reference == max(p["goodput_rps"] for p in peers)
        else:
            assert v.level == "chat x1" and v.value == pytest.approx(kv["hit_rate"] / kv["oracle_hit_rate"])
    assert [v.target for v in chat.verdicts if v.level == "chat x1"] == [
        "TTFT p99 <= 1.02x best peer", "goodput >= 0.98x best peer", "hit >= 0.95x oracle",
    ]  # fmt: skip
    assert [v.row for v in synthetic.verdicts if v.target.startswith("attainment")] == ["kvplane/predictive"]
    # The command prints one table per group and the count, and plots them (--plot).
    plot = tmp_path / "grid.png"
    assert sim_main.run(parse(*TINY, "--plot", str(plot))) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 20_000
    out = capsys.readouterr().out
    assert "### chat: chat, 8 both workers" in out and "### synthetic:" in out
    met, judged = grid.summary(results)
    assert f"kvplane met {met} of {judged} targets judged (--requests 12 per level)" in out


def _row(level, routing, ttft, goodput, hit=0.5, oracle=0.5, admission="none", load_factor=None, attainment=1.0):
    return {"level": level, "routing": routing, "admission": admission, "ttft_p99_ms": ttft, "goodput_rps": goodput,
            "hit_rate": hit, "oracle_hit_rate": oracle, "load_factor": load_factor, "attainment": attainment}  # fmt: skip


def test_judge_compares_with_the_best_peer_within_the_slack():
    rows = [
        _row("x1", "kvplane", 102.0, 9.8, hit=0.57, oracle=0.6),
        _row("x1", "dynamo", 100.0, 9.0),
        _row("x1", "sglang", 120.0, 10.0),
        _row("x1", "round-robin", 50.0, 20.0),  # a baseline, not a peer: never the reference
        _row("x2", "kvplane", 103.0, 9.7, hit=0.1),
        _row("x2", "llm-d", 100.0, 10.0),
        _row("x2", "kvplane", 90.0, 9.9, admission="predictive", load_factor=2.0, attainment=0.94),
        _row("x2", "dynamo", 80.0, 12.0, admission="predictive"),  # peers are judged with admission none only
    ]
    got = [(v.level, v.row, v.target.split()[0], v.reference, v.reference_of, v.met) for v in grid.judge(rows, ["x1", "x2"], "none")]
    assert got == [
        ("x1", "kvplane/none", "TTFT", 100.0, "dynamo", True),  # 102 <= 102
        ("x1", "kvplane/none", "goodput", 10.0, "sglang", True),  # 9.8 >= 9.8
        ("x1", "kvplane/none", "hit", 0.95, "bound", True),  # 0.57 / 0.6 = 0.95
        ("x2", "kvplane/none", "TTFT", 100.0, "llm-d", False),  # 103 > 102
        ("x2", "kvplane/none", "goodput", 10.0, "llm-d", False),  # 9.7 < 9.8; no hit target above the lowest load
        ("x2", "kvplane/predictive", "TTFT", 100.0, "llm-d", True),
        ("x2", "kvplane/predictive", "goodput", 10.0, "llm-d", True),
        ("x2", "kvplane/predictive", "attainment", 0.95, "bound", False),
    ]
    # Without a peer in the run nothing can be judged against one.
    alone = grid.judge([_row("x1", "kvplane", 1.0, 1.0, oracle=0.0)], ["x1"], "none")
    assert [v.met for v in alone] == [None, None, None]
