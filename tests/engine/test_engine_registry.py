"""The engine registry and `kvplane agent --engine`: names, refusals, configs."""

from __future__ import annotations

import argparse

import pytest

from kvplane.dataplane import engines
from kvplane.dataplane.agent import main as agent_main
from kvplane.dataplane.agent.config import AgentConfig
from kvplane.dataplane.engines.reference import EngineConfig


def parse(*argv: str) -> AgentConfig:
    parser = argparse.ArgumentParser(exit_on_error=False)
    agent_main.add_arguments(parser)
    return agent_main.config_from_args(parser.parse_args(["--worker-id", "w", *argv]))


def test_the_reference_engine_is_the_default_and_every_plugin_names_itself():
    assert engines.ENGINE_NAMES[0] == "reference" == engines.DEFAULT_ENGINE
    assert {"reference", "sim", "vllm", "sglang"} <= set(engines.ENGINE_NAMES)
    assert [p.NAME for p in engines.plugins()] == list(engines.ENGINE_NAMES)


def test_an_unknown_engine_is_refused_with_the_known_names():
    known = ", ".join(engines.ENGINE_NAMES)
    with pytest.raises(engines.UnknownEngineError, match=f"unknown engine 'tgi'; known engines: {known}"):
        engines.plugin("tgi")
    with pytest.raises(ValueError, match=f"unknown engine 'nope'; known engines: {known}"):
        AgentConfig(worker_id="w", engine_name="nope").validate()


def test_a_config_of_the_wrong_type_is_refused():
    with pytest.raises(ValueError, match="engine 'reference' takes a EngineConfig, got a dict"):
        engines.check_config("reference", {"model": "builtin-tiny"})
    with pytest.raises(ValueError, match="EngineConfig.num_blocks must be a positive integer, got 0"):
        AgentConfig(worker_id="w", engine=EngineConfig(num_blocks=0)).validate()


def test_agent_flags_build_the_chosen_engines_config():
    config = parse("--engine", "reference", "--num-blocks", "32", "--block-size", "8", "--host-blocks", "64")
    assert config.engine_name == "reference"
    assert config.engine == EngineConfig(num_blocks=32, block_size=8, num_host_blocks=64)
    assert parse().engine_name == "reference"  # the default: nothing changes for current users


def test_sim_flags_build_a_sim_config_sharing_the_common_flags():
    config = parse("--engine", "sim", "--sim-gpu", "h200", "--sim-model", "llama-3-8b", "--sim-tp", "1", "--block-size", "32",
                   "--speedup", "4", "--sim-step-overhead-ms", "2")  # fmt: skip
    assert config.engine_name == "sim"
    sim = config.engine
    assert (sim.gpu, sim.model, sim.tp, sim.block_size, sim.speedup, sim.roofline.step_overhead_s) == (
        "h200",
        "llama-3-8b",
        1,
        32,
        4.0,
        0.002,
    )
    with pytest.raises(ValueError, match="unknown gpu 'tpu'"):
        parse("--engine", "sim", "--sim-gpu", "tpu")


def test_agent_refuses_an_unknown_engine_flag():
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'nope'"):
        parse("--engine", "nope")


def test_sim_agent_args_rebuild_the_same_config():
    from kvplane.dataplane.engines.sim import SimConfig
    from kvplane.dataplane.engines.sim.plugin import agent_args
    from kvplane.hardware import RooflineConfig

    config = SimConfig(gpu="b200", model="qwen2.5-7b", tp=2, link="nvlink", roofline=RooflineConfig(mfu=0.4, step_overhead_s=0.0025),
                       block_size=32, num_blocks=900, max_num_seqs=64, speedup=0.5, seed=3)  # fmt: skip
    assert parse(*agent_args(config)).engine == config
