"""kvplane plan: the KV arithmetic, the feasibility check and the simulated search."""

from __future__ import annotations

import argparse

import pytest

from kvplane.apps.sim import plan as plan_mod


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    plan_mod.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_70b_kv_numbers_are_exact_and_an_impossible_objective_is_named_before_any_search():
    a = args(
        "--sim-model", "llama-3-70b", "--sim-gpu", "h100", "--sim-tp", "4", "--input-tokens", "4096", "--ttft-ms", "100", "--tpot-ms", "5"
    )
    result = plan_mod.plan(a, lambda message: None)
    kv = result["kv"]
    assert (kv["bytes_per_token"], kv["prompt_tokens"], kv["bytes_per_request"]) == (327_680, 4096, 1_342_177_280)
    assert round(kv["transfer_ms"]["100gbe"]) == 107 and round(kv["transfer_ms"]["400gbe"]) == 27
    assert "candidates" not in result and len(result["infeasible"]) == 2
    assert "over the TTFT objective" in result["infeasible"][0] and "over the TPOT objective" in result["infeasible"][1]
    text = plan_mod.format_text(result)
    assert "327,680 B per token; 1.34 GB for a 4,096-token prompt" in text
    assert "100gbe 107 ms" in text and "400gbe 27 ms" in text
    assert "no configuration meets the objectives" in text


SMALL = ("--sim-model", "llama-3-8b", "--sim-tp", "1", "--input-tokens", "1024-2048", "--output-tokens", "32", "--duration", "6")


def test_a_worker_budget_gives_each_mode_its_most_requests_within_the_objectives():
    result = plan_mod.plan(args(*SMALL, "--workers", "3", "--ttft-ms", "500", "--tpot-ms", "30"), lambda message: None)
    cands = result["candidates"]
    assert set(cands) == {"colocated", "disaggregated"}
    assert cands["colocated"]["both_workers"] == 3 and cands["disaggregated"]["workers"] == 3
    for c in cands.values():
        assert c["attainment"] >= 0.9 and c["goodput_rps"] > 0 and c["bottleneck"]
    assert result["answer"] == max(cands.values(), key=lambda c: c["goodput_rps"])["mode"]
    text = plan_mod.format_text(result)
    assert "answer: " in text and "bottleneck: " in text


def test_a_target_rate_gives_the_fewest_workers_that_meet_it():
    a = args(*SMALL, "--rate", "6", "--ttft-ms", "500", "--tpot-ms", "30")
    planner = plan_mod.Planner(a, lambda message: None)
    found = planner.fewest_workers(plan_mod.COLOCATED, 6.0)
    assert found is not None and planner.meets(found)
    n = found.candidate.num_workers
    if n > 1:  # one worker fewer misses
        assert not planner.meets(planner.evaluate(plan_mod.Candidate(plan_mod.COLOCATED, 0, n - 1), 6.0))


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="input tokens must be a range 0 < low <= high, got 10-5"):
        plan_mod.plan(args("--input-tokens", "10-5"), lambda message: None)
    with pytest.raises(ValueError, match="unknown link 'carrier-pigeon'"):
        plan_mod.plan(args("--sim-link", "carrier-pigeon"), lambda message: None)
