"""kvplane sim: the real planner against simulated workers in virtual time."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter

import numpy as np
import pytest

from kvplane import hardware
from kvplane.apps.sim import main as sim_main
from kvplane.apps.sim.clock import EventLoop
from kvplane.apps.sim.fleet import AgentTiming
from kvplane.apps.sim.simulator import FleetSpec, SimRequest, Simulator
from kvplane.controlplane.core.planner import PlannerConfig
from kvplane.controlplane.core.policies import params_type
from kvplane.controlplane.core.policies.least_load import LeastLoadParams
from kvplane.controlplane.core.policies.prefix_only import PrefixOnlyParams
from kvplane.controlplane.core.router import RouterConfig
from kvplane.controlplane.core.settings import ClusterSettings
from kvplane.dataplane.engines.sim import SimConfig
from kvplane.latency import prefill_attention

ENGINE = SimConfig(model="llama-3-8b", gpu="h100", tp=1, link="100gbe")
HOP = 0.0005


def one(prompt_tokens: int, max_tokens: int, arrival: float = 0.0) -> SimRequest:
    prompt = tuple(range(1, prompt_tokens + 1))
    return SimRequest(arrival, prompt_tokens, max_tokens, lambda: prompt)


def simulate(fleet: FleetSpec, requests: list[SimRequest], **planner) -> Simulator:
    config = PlannerConfig(admission_policy="none", **planner)
    sim = Simulator(fleet, config, ClusterSettings(), agent=AgentTiming(hop_s=HOP))
    sim.result = sim.run(requests)
    return sim


def test_the_event_loop_runs_in_time_order_and_ties_in_scheduling_order():
    loop, seen = EventLoop(), []
    loop.at(2.0, seen.append, "c")
    loop.at(1.0, seen.append, "a")
    loop.at(1.0, seen.append, "b")
    loop.run()
    assert seen == ["a", "b", "c"] and loop.now == 2.0
    with pytest.raises(ValueError, match="before now"):
        loop.at(1.5, seen.append, "late")


def test_a_local_request_s_ttft_is_two_hops_and_its_prefill_and_tpot_its_decode_steps():
    sim = simulate(FleetSpec(ENGINE, num_both=1), [one(3000, 3)])
    r = ENGINE.roofline_model()
    prefill = r.step_seconds(3000, prefill_attention(3000, 0))
    decode = [r.step_seconds(decode_seqs=1, decode_context_tokens=3000 + k) for k in (1, 2)]
    (rec,) = sim.result.records
    assert rec.ttft_s == pytest.approx(HOP + prefill + HOP, rel=1e-12)
    assert rec.tpot_s == pytest.approx(sum(decode) / 2, rel=1e-12)
    assert rec.num_tokens == 3 and not rec.disaggregated and rec.cached_tokens == 0


def test_a_disaggregated_request_s_ttft_adds_the_prefill_hop_the_transfer_and_the_tail():
    fleet = FleetSpec(ENGINE, num_prefill=1, num_decode=1, num_both=0)
    # A policy that disaggregates by a token threshold (kvplane's, in seconds, keeps this prompt on
    # the idle decode worker: below).
    sim = simulate(fleet, [one(4000, 2)], router=RouterConfig(policy=LeastLoadParams(), disagg_threshold_tokens=1024))
    r = ENGINE.roofline_model()
    prefill = r.step_seconds(4000, prefill_attention(4000, 0))
    transfer = hardware.link("100gbe").transfer_seconds(250 * ENGINE.roofline_model().model.layout(16).block_nbytes)
    tail = r.step_seconds(16, prefill_attention(16, 3984))  # the last block is recomputed for its logits
    (rec,) = sim.result.records
    assert rec.disaggregated and rec.prefill_worker == "prefill-0" and rec.decode_worker == "decode-0"
    assert rec.kv_transfer_bytes == 250 * 2_097_152
    assert rec.ttft_s == pytest.approx(4 * HOP + prefill + transfer + tail, rel=1e-12)
    # kvplane: on an idle fleet the transfer and the tail only add to the same prefill: local.
    (rec,) = simulate(fleet, [one(4000, 2)]).result.records
    assert not rec.disaggregated and rec.decode_worker == "decode-0"
    assert rec.ttft_s == pytest.approx(2 * HOP + prefill, rel=1e-12)


@pytest.mark.parametrize("import_wait_s", [10.0, 0.0])
def test_a_pull_into_a_full_decode_pool_waits_for_blocks_else_prefills_locally(import_wait_s):
    """Two 4,000-token prompts prefilled remotely (250 blocks each) for one decode worker of 400
    blocks: the second's KV waits for the first to finish and free its blocks, as the agent waits
    (AgentTiming.import_wait_s); with no wait it is computed again on the decode worker."""
    engine = dataclasses.replace(ENGINE, num_blocks=400)
    fleet = FleetSpec(engine, num_prefill=1, num_decode=1, num_both=0)
    config = PlannerConfig(admission_policy="none", router=RouterConfig(policy=LeastLoadParams(), disagg_threshold_tokens=1024))
    sim = Simulator(fleet, config, ClusterSettings(), agent=AgentTiming(hop_s=HOP, import_wait_s=import_wait_s))
    other = tuple(range(5001, 9001))  # shares no block with the first
    first, second = sim.run([one(4000, 50), SimRequest(0.001, 4000, 50, lambda: other)]).records
    assert first.disaggregated and first.kv_wait_s == 0 and first.finished_s is not None
    assert second.finished_s is not None and second.num_tokens == 50
    if import_wait_s:
        assert second.disaggregated and second.prefill_worker == "prefill-0" and second.kv_transfer_bytes == 250 * 2_097_152
        assert second.kv_wait_s > 0 and second.ttft_s > first.ttft_s + second.kv_wait_s
    else:
        assert not second.disaggregated and second.prefill_worker == "decode-0" and second.kv_transfer_bytes == 0


def test_the_planner_hears_a_remote_prefill_end_before_the_pull_waits_for_blocks():
    """As a relaying replica hears it from the decode agent (report_prefill_done): the prefill
    worker's share of the request leaves its queue then, not at the first token."""
    engine = dataclasses.replace(ENGINE, num_blocks=400)
    fleet = FleetSpec(engine, num_prefill=1, num_decode=1, num_both=0)
    config = PlannerConfig(admission_policy="none", router=RouterConfig(policy=LeastLoadParams(), disagg_threshold_tokens=1024))
    sim = Simulator(fleet, config, ClusterSettings(), agent=AgentTiming(hop_s=HOP))
    told: list[float] = []
    heard = sim.planner.remote_prefill_ended
    sim.planner.remote_prefill_ended = lambda dispatch_id, now: (told.append(now), heard(dispatch_id, now))  # type: ignore[method-assign]
    other = tuple(range(5001, 9001))
    first, second = sim.run([one(4000, 50), SimRequest(0.001, 4000, 50, lambda: other)]).records
    assert second.disaggregated and second.kv_wait_s > 0 and len(told) == 2
    assert told[0] < first.first_token_s and told[1] + second.kv_wait_s < second.first_token_s


def test_a_repeated_prompt_hits_the_cache_of_the_worker_the_planner_sent_it_to():
    sim = simulate(FleetSpec(ENGINE, num_both=4), [one(1600, 4, 0.0), one(1600, 4, 5.0)])
    first, second = sim.result.records
    assert second.decode_worker == first.decode_worker and second.cached_tokens == 1584
    assert second.ttft_s < first.ttft_s / 5


def _hot_prefix_burst(router: RouterConfig) -> list:
    """A 6,000-token prefix cached on one worker, then 200 requests sharing it (200 new tokens
    each) every 5 ms: more prefill than one H100 computes in the time."""
    hot = tuple(range(1, 6001))
    requests = [SimRequest(0.0, 6001, 2, lambda: (*hot, 7))]
    for i in range(200):
        prompt = (*hot, *range(20_000 + 200 * i, 20_200 + 200 * i))
        requests.append(SimRequest(5.0 + 0.005 * i, len(prompt), 64, lambda p=prompt: p))
    return simulate(FleetSpec(ENGINE, num_both=4), requests, router=router, initial_link_gb_per_s=12.5).result.records[1:]


def test_a_hot_prefix_is_replicated_by_fetch_not_piled_on_its_holder_or_recomputed():
    load_blind = _hot_prefix_burst(RouterConfig(policy=PrefixOnlyParams()))
    kvplane = _hot_prefix_burst(RouterConfig())
    p99 = lambda records: float(np.percentile([r.ttft_s for r in records], 99))  # noqa: E731
    print(f"TTFT p99: prefix-only {p99(load_blind):.3f} s, kvplane {p99(kvplane):.3f} s")
    assert all(r.cached_tokens >= 6000 for r in load_blind)  # every reader on a holder, however long its queue
    holders = Counter(r.decode_worker for r in kvplane)
    fetched = [r for r in kvplane if r.fetched]
    recomputed = [r for r in kvplane if r.cached_tokens < 6000]
    # The prefix reaches every worker by a pull (6,000 tokens over 100 GbE: ~70 ms against ~225 ms
    # to compute), and a reader that arrives while a pull is in flight does not compute it again.
    assert len(holders) == 4 and len(fetched) >= 3 and recomputed == []
    assert p99(kvplane) < p99(load_blind) / 2


def _sweep(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    sim_main.add_arguments(parser)
    return sim_main.run_sweep(parser.parse_args(list(argv)), lambda message: None)


SMALL = ("--workload", "mix", "--rate", "8", "--duration", "10", "--both", "3", "--sim-model", "llama-3-8b", "--sim-tp", "1")


def test_identical_seeds_give_identical_json_and_another_seed_another():
    a = json.dumps(_sweep(*SMALL, "--compare-routing", "kvplane,round-robin"))
    assert a == json.dumps(_sweep(*SMALL, "--compare-routing", "kvplane,round-robin"))
    assert a != json.dumps(_sweep(*SMALL, "--compare-routing", "kvplane,round-robin", "--seed", "1"))


def test_pricing_only_the_workers_that_can_win_decides_as_pricing_every_worker():
    """An overloaded fleet of 40 (1,213 decisions, every one priced with queues, inflow and remote
    prefill): the default, which prices the holders and the 16 least of the rest by each of its
    measures (`--max-uncached-candidates`), ends with the very rows of pricing all 40. Pricing
    only 2 of the rest does not: here the winner is often outside a too-short list."""
    args = ("--workload", "synthetic", "--rate", "300", "--duration", "4", "--input-tokens", "1024-4096",
            "--output-tokens", "64-256", "--both", "40", "--compare-routing", "kvplane", "--admission", "none")  # fmt: skip
    every = _sweep(*args, "--max-uncached-candidates", "0")["rows"]
    assert every[0]["requests"] > 1000 and every[0]["attainment"] < 0.9  # busy enough that placement decides
    assert _sweep(*args)["rows"] == every
    assert _sweep(*args, "--max-uncached-candidates", "2")["rows"] != every


def test_rows_carry_the_benchmarks_columns_and_policies_compare():
    result = _sweep(*SMALL, "--compare-routing", "round-robin,kvplane", "--compare-admission", "none,predictive", "--planner-cost")
    rows = result["rows"]
    assert [(r["routing"], r["admission"]) for r in rows] == [
        ("round-robin", "none"), ("round-robin", "predictive"), ("kvplane", "none"), ("kvplane", "predictive"),
    ]  # fmt: skip
    for r in rows:
        assert r["requests"] == r["admitted"] + r["rejected"] and r["failed"] == 0
        assert (
            0 <= r["hit_rate"] <= r["oracle_hit_rate"] + 0.05 and r["ttft_p50_ms"] > 0 and r["planner_cost"]["decisions"] == r["requests"]
        )
    assert result["config"]["kv_bytes_per_token"] == 131_072


def test_on_the_chat_workload_prefix_routing_beats_round_robin_as_in_bench_prefix():
    rows = _sweep(
        "--workload", "chat", "--both", "4", "--sim-model", "llama-3-8b", "--sim-tp", "1", "--compare-routing", "round-robin,kvplane"
    )["rows"]
    # The same requests as `kvplane bench prefix`'s chat, so the same oracle (0.744 there).
    assert rows[0]["oracle_hit_rate"] == rows[1]["oracle_hit_rate"] == pytest.approx(0.744, abs=0.001)
    assert rows[1]["hit_rate"] > rows[0]["hit_rate"] + 0.1


@pytest.mark.cluster
def test_the_same_workload_runs_through_virtual_time_and_real_processes():
    """The same 12 disaggregated requests through `kvplane sim` and through a control plane with
    two sim agents (real processes, gRPC, the real transport): the same requests complete, all
    disaggregated, moving the same KV bytes, and the comparison's errors are reported. Routed by
    least-load, whose token threshold sends every one of these prompts to the prefill worker.

    How close the real side's TTFT and goodput come to virtual time depends on this machine's
    load (7-10 % on a quiet 2-core machine, 49 % beside a busy suite): that is what
    `kvplane sim --compare-processes` measures and reports (docs/benchmarks.md), not a test's
    assertion."""
    result = _sweep(
        "--workload", "synthetic", "--input-tokens", "3000-4000", "--output-tokens", "16", "--rate", "1", "--duration", "12",
        "--prefill", "1", "--decode", "1", "--admission", "none", "--compare-routing", "least-load", "--compare-processes",
    )  # fmt: skip
    (row,) = result["rows"]
    real = row["processes"]
    assert row["requests"] == real["requests"] and real["failed"] == 0 and row["disaggregated"] == real["disaggregated"] == row["requests"]
    assert row["kv_bytes_moved"] == real["kv_bytes_moved"]
    # The reported error is (virtual - real) / real, per compared number.
    errors = row["processes_error"]
    assert errors["ttft_p50_ms"] == pytest.approx((row["ttft_p50_ms"] - real["ttft_p50_ms"]) / real["ttft_p50_ms"], abs=1e-3)
    assert errors["goodput_rps"] == pytest.approx((row["goodput_rps"] - real["goodput_rps"]) / real["goodput_rps"], abs=1e-3)


def test_a_synthetic_workload_that_does_not_fit_the_model_s_context_is_refused_up_front():
    from kvplane.apps.sim.workloads import SyntheticSpec

    spec = SyntheticSpec((4096, 8192), (64, 256), 0.0).validate()
    with pytest.raises(ValueError, match="8192 prompt \\+ 256 output tokens exceed llama-3-70b's context of 8192 tokens"):
        spec.check_fits("llama-3-70b", hardware.model("llama-3-70b").max_context)
    assert spec.check_fits("llama-3.1-70b", hardware.model("llama-3.1-70b").max_context) is spec


@pytest.mark.parametrize("policy", ["kvplane", "dynamo", "sglang", "llm-d", "least-load", "prefix-only", "round-robin"])
def test_only_kvplane_s_rule_discounts_reports_its_measurements_contradict(policy):
    """core/trust.py is kvplane's; the routers the other policies follow take reports as they come."""
    config = PlannerConfig(admission_policy="none", router=RouterConfig(policy=params_type(policy)()))
    sim = Simulator(FleetSpec(ENGINE, num_both=2), config)
    assert sim.planner.trust.enabled == (policy == "kvplane")


def test_every_decision_is_written_with_its_candidates_prediction_and_outcome(tmp_path):
    """`kvplane sim --decisions`: one line per request per run, at its end; kvplane's candidates
    carry their predicted seconds, a peer's its own cost; an admitted request its prediction and
    what was measured, a rejected one admission's reason."""
    path = tmp_path / "decisions.jsonl"
    parser = argparse.ArgumentParser()
    sim_main.add_arguments(parser)
    args = parser.parse_args([*SMALL, "--rate", "400", "--duration", "3", "--compare-routing", "kvplane,dynamo", "--admission", "predictive",
                              "--decisions", str(path)])  # fmt: skip
    assert sim_main.run(args) == 0
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    rows = _sweep(*SMALL, "--rate", "400", "--duration", "3", "--compare-routing", "kvplane,dynamo", "--admission", "predictive")["rows"]
    for row in rows:  # the same runs: one line per request, none twice
        mine = [d for d in lines if d["run"] == {"level": row["level"], "routing": row["routing"], "admission": "predictive"}]
        assert sorted(d["request"] for d in mine) == list(range(row["requests"]))
        assert sum(d["outcome"] == "rejected" for d in mine) == row["rejected"] > 0
    for d in lines:
        workers = [c["worker"] for c in d["candidates"]]
        assert d["router"]["decode_worker"] in workers and d["prompt_tokens"] > 0
        kvplane = d["run"]["routing"] == "kvplane"
        assert all(("ttft_ms" in c) == ("cost_ms" in c) == kvplane and c["note"] for c in d["candidates"])
        if d["outcome"] == "rejected":
            assert not d["admission"]["admitted"] and d["admission"]["reason"] and "measured" not in d
        else:
            assert d["outcome"] == "finished" and d["admission"]["admitted"]
            assert d["predicted"]["ttft_ms"] >= 0 and d["measured"]["ttft_ms"] > 0 and d["measured"]["output_tokens"] > 0
            # Admission holds the TPOT's 95 % point: the mean plus 1.645 spreads (predictor.tpot_spread_seconds).
            p = d["predicted"]
            assert p["tpot_high_ms"] >= p["tpot_ms"] and p["tpot_spread_ms"] >= 0 and p["ttft_spread_ms"] >= 0
            m = d["measured"]  # a transfer's time when KV moved, none when it did not
            assert (m["kv_transfer_ms"] > 0) == (m["kv_transfer_bytes"] > 0)
            assert p["room_wait_ms"] >= 0 and m["kv_wait_ms"] >= 0  # waiting for a slot or blocks: predicted, and for a pull, measured
