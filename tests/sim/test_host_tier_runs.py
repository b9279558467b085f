"""Host tiers in `kvplane sim` and `kvplane plan`: hits by tier in the rows, the oracle with every
tier's capacity, the planner priced at the simulated worker's copy rates, `plan --host-gib`."""

from __future__ import annotations

import argparse

import pytest

from kvplane.apps.sim import main as sim_main
from kvplane.apps.sim import plan as plan_mod
from kvplane.apps.sim import report
from kvplane.apps.sim.simulator import FleetSpec, SimRequest, Simulator
from kvplane.apps.sim.sweep import Sweep
from kvplane.controlplane.core.planner import PlannerConfig
from kvplane.dataplane.engines.sim import SimConfig
from kvplane.types import Objective, Tier

GIB_PER_BLOCK = 2 * 2**20 / 2**30  # llama-3-8b, 16-token blocks: 2 MiB


def cycling(num_rounds: int) -> list[SimRequest]:
    """Four 1,001-token prompts, one a second, round after round: 252 blocks, more than the device's 200."""
    prompts = [[1000 * (k + 1) + i for i in range(1001)] for k in range(4)]
    out = []
    for n in range(num_rounds * 4):
        prompt = prompts[n % 4]
        out.append(SimRequest(float(n), len(prompt), 4, lambda p=prompt: p))
    return out


def simulate(host_gib: float):
    engine = SimConfig(model="llama-3-8b", gpu="h100", tp=1, num_blocks=200, host_gib=host_gib)
    sim = Simulator(FleetSpec(engine, num_both=1), PlannerConfig(admission_policy="none"))
    return sim, sim.run(cycling(3))


def test_a_host_tier_turns_device_thrashing_into_host_hits_that_cost_less_than_prefill():
    _, without = simulate(0.0)
    sim, with_host = simulate(512 * GIB_PER_BLOCK)
    objectives = {"interactive": Objective(2000, 200)}
    row0 = report.row(without, 12.0, objectives)
    row1 = report.row(with_host, 12.0, objectives)
    # LRU over four prompts that do not fit: the device alone keeps only some prompts' heads.
    assert [r.cached_tokens for r in without.records[4:]] != [992] * 8 and row0["hit_host"] == 0.0
    # With the host tier every later round's prompt hits in full (62 blocks of 1,001 tokens): what
    # the device kept (as without the tier: the same requests, the same device LRU) plus the rest from host.
    later = with_host.records[4:]
    kept = [r.cached_tokens for r in without.records[4:]]
    assert [r.cached_tokens for r in later] == [992] * 8 and [r.loaded_tokens for r in later] == [992 - k for k in kept]
    assert row1["hit_rate"] == round(8 * 992 / (12 * 1001), 4) > row0["hit_rate"]
    assert row1["hit_device"] == row0["hit_rate"] and row1["hit_disk"] == 0.0
    assert row1["hit_host"] == round(sum(992 - k for k in kept) / (12 * 1001), 4)
    assert all(r.ttft_s <= w.ttft_s for r, w in zip(later, without.records[4:]))
    assert sum(r.ttft_s for r in later) < sum(w.ttft_s for w in without.records[4:])
    # The oracle pools device and host (200 + 512 blocks): every later prompt hits; infinite: the same.
    assert row1["oracle_hit_rate"] == row1["infinite_hit_rate"] == row1["hit_rate"]
    assert row0["oracle_hit_rate"] < row1["oracle_hit_rate"] and row0["infinite_hit_rate"] == row1["infinite_hit_rate"]
    # The cache index heard of the host blocks as the engine's events said.
    counts = sim.index.blocks_by_tier()
    assert sum(c.get(Tier.HOST, 0) for c in counts.values()) == 4 * 62


def parse(module, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_sim_host_gib_gives_one_row_per_size_with_hits_by_tier_and_prices_tier_loads_at_the_workers_rates():
    args = parse(sim_main, "--workload", "trace", "--requests", "12", "--both", "2", "--host-gib", "0,64", "--sim-host-gb-per-s", "40")
    result = sim_main.run_sweep(args, lambda message: None)
    assert [r["host_gib"] for r in result["rows"]] == [0.0, 64.0]
    for r in result["rows"]:
        assert r["hit_device"] + r["hit_host"] + r["hit_disk"] == pytest.approx(r["hit_rate"], abs=2e-4)
        assert r["oracle_hit_rate"] <= r["infinite_hit_rate"]
    assert result["config"]["host_gib"] == [0.0, 64.0] and result["config"]["host_gb_per_s_per_worker"] == 4 * 40.0
    header = sim_main.format_table(result).splitlines()[0]
    assert "| host GiB | hit | hit device | hit host | hit disk | oracle | infinite |" in header
    # The planner prices a host block at the simulated worker's rate: tp 4 x 40 GB/s; disk: the drive's 7.
    sweep = Sweep(parse(sim_main, "--host-gib", "64", "--sim-host-gb-per-s", "40"), lambda message: None)
    policy = sweep.planner_config("kvplane", "none").router.policy
    assert (policy.host_load_gb_per_s, policy.disk_load_gb_per_s) == (160.0, 7.0)
    # A rate given on the command line wins, as --initial-link-gb-per-s does.
    sweep = Sweep(parse(sim_main, "--host-load-gb-per-s", "3"), lambda message: None)
    assert sweep.planner_config("kvplane", "none").router.policy.host_load_gb_per_s == 3.0


def test_sim_refuses_bad_host_sizes():
    parser = argparse.ArgumentParser(exit_on_error=False)
    sim_main.add_arguments(parser)
    for bad in ("-1", "x", ""):
        try:
            parser.parse_args(["--host-gib", bad])
        except argparse.ArgumentError as e:
            assert "expected GiB sizes >= 0" in str(e)
        else:
            raise AssertionError(f"--host-gib {bad!r} was accepted")


def test_plan_host_gib_answers_with_a_row_per_host_size():
    a = parse(plan_mod, "--sim-model", "llama-3-8b", "--sim-tp", "1", "--sim-num-blocks", "400", "--input-tokens", "1024-2048",
              "--output-tokens", "16", "--prefix-share", "0.5", "--duration", "4", "--workers", "2", "--rate", "4",
              "--host-gib", "0,2")  # fmt: skip
    result = plan_mod.plan(a, lambda message: None)
    h = result["host_tiers"]
    assert "candidates" not in result and result["num_simulations"] == 2
    assert (h["workers"], h["rate_rps"]) == (2, 4.0) and [r["host_gib"] for r in h["rows"]] == [0.0, 2.0]
    for r in h["rows"]:
        assert r["hit_device"] + r["hit_host"] + r["hit_disk"] == pytest.approx(r["hit_rate"], abs=2e-4)
    text = plan_mod.format_text(result)
    assert "host memory per worker: 2 colocated workers at 4.00 requests/s" in text
    assert "host GiB | hit | device | host | disk | oracle | infinite | TTFT p50 | TTFT p99 | goodput/s | attain" in text
    assert text.count("\n0 | ") == 1 and text.count("\n2 | ") == 1
