"""The control plane's routing, admission and prediction flags are generated from the planner's
config dataclasses: every field has one, defaults come from the dataclasses, values round-trip,
and the flags the project has always had keep their names."""

from __future__ import annotations

import argparse
from dataclasses import fields, is_dataclass

import pytest

from kvplane.controlplane.core.admission import admission_policy_names
from kvplane.controlplane.core.planner import PlannerConfig
from kvplane.controlplane.core.policies import params_types, routing_policy_names
from kvplane.controlplane.core.policies.kvplane import KvplaneParams
from kvplane.controlplane.core.policies.round_robin import RoundRobinParams
from kvplane.controlplane.main import add_arguments, config_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _leaf_field_names(config) -> set[str]:
    names = set()
    for f in fields(config):
        value = getattr(config, f.name)
        if "params_types" in f.metadata:
            names.add(f.name)
            for t in f.metadata["params_types"]():
                names |= _leaf_field_names(t())
        elif is_dataclass(value):
            names |= _leaf_field_names(value)
        else:
            names.add(f.name)
    return names


def test_no_flags_give_the_default_config():
    assert config_from_args(parse()).planner == PlannerConfig()


def test_every_planner_field_has_a_flag():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    dests = {a.dest for a in parser._actions}
    flagged = {"policy": "routing_policy", "disagg_threshold_tokens": "disagg_threshold",
               "prediction_ttl_s": "prediction_ttl", "admission_policy": "admission"}  # fmt: skip
    missing = {n for n in _leaf_field_names(PlannerConfig()) if flagged.get(n, n) not in dests}
    assert missing == set()


def test_flags_reach_the_router_its_policy_and_admission():
    planner = config_from_args(parse(
        "--routing-policy", "kvplane", "--host-load-gb-per-s", "2", "--prediction-ttl", "30", "--disagg-threshold", "64",
        "--prefill-load-scale", "2.5", "--overlap-weight-disk", "0.25", "--admission", "predictive", "--max-running", "1",
    )).planner  # fmt: skip
    assert planner.router.policy == KvplaneParams(host_load_gb_per_s=2.0, prediction_ttl_s=30.0)
    assert (planner.router.disagg_threshold_tokens, planner.router.cost.prefill_load_scale) == (64, 2.5)
    assert planner.router.cost.overlap_weight_disk == 0.25
    assert (planner.admission_policy, planner.admission.max_running) == ("predictive", 1)
    # Another policy takes its own params; the kvplane policy's flags do not apply to it.
    assert (
        config_from_args(parse("--routing-policy", "round-robin", "--host-load-gb-per-s", "2")).planner.router.policy == RoundRobinParams()
    )


def test_choices_are_listed_and_bad_values_are_refused(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = parser.format_help()
    assert "{" + ",".join(admission_policy_names()) + "}" in text
    assert "{" + ",".join(routing_policy_names()) + "}" in text
    assert [t.name for t in params_types()] == list(routing_policy_names())
    with pytest.raises(SystemExit):
        parse("--admission", "fifo")
    assert "invalid choice: 'fifo'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="KvplaneParams.host_load_gb_per_s must be > 0"):
        config_from_args(parse("--host-load-gb-per-s", "0"))


def test_the_peers_policies_are_selectable_on_a_control_plane_with_their_own_flags():
    from kvplane.controlplane.core.policies.dynamo import DynamoParams  # noqa: PLC0415
    from kvplane.controlplane.core.policies.llm_d import LlmDParams  # noqa: PLC0415
    from kvplane.controlplane.core.policies.sglang import SglangParams  # noqa: PLC0415

    assert config_from_args(parse("--routing-policy", "dynamo")).planner.router.policy == DynamoParams()
    assert config_from_args(parse("--routing-policy", "llm-d")).planner.router.policy == LlmDParams()
    sglang = config_from_args(parse("--routing-policy", "sglang", "--sglang-cache-threshold", "0.5")).planner.router.policy
    assert sglang == SglangParams(sglang_cache_threshold=0.5)


def test_bus_for_agents_needs_a_nats_bus_and_a_nats_url():
    config = config_from_args(parse("--bus", "nats://127.0.0.1:4222", "--bus-for-agents", "nats://10.0.0.1:4222"))
    assert config.validate().bus_for_agents == "nats://10.0.0.1:4222"
    with pytest.raises(ValueError, match="needs a NATS bus"):
        config_from_args(parse("--bus-for-agents", "nats://127.0.0.1:4222")).validate()
    with pytest.raises(ValueError, match="must be nats://HOST:PORT"):
        config_from_args(parse("--bus", "nats://127.0.0.1:4222", "--bus-for-agents", "store")).validate()
