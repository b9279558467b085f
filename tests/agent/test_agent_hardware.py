"""What a worker says it runs on (WorkerInfo.hardware): the control plane prices workers of one
model, KV layout, prefill chunk and hardware with one step-time model (core/step_pool.py), so the
label must tell apart what runs differently and agree where it runs alike."""

from __future__ import annotations

import asyncio

from kvplane.dataplane import engines
from kvplane.dataplane.engines.sim.config import SimConfig
from kvplane.types import Role

from .helpers import serve_agent


def test_the_engine_names_its_hardware_and_the_agent_flag_overrides_it():
    async def body():
        async with serve_agent("ref", Role.BOTH) as agent:
            assert agent.service.worker_info().hardware.startswith("cpu ")  # the reference engine's device
        sim = engines.create("sim", SimConfig(gpu="h100-sxm", model="llama-3-8b", tp=2, num_blocks=64))
        async with serve_agent("sim", Role.BOTH, engine=sim, hardware="H100 x2 (rack 7)") as agent:
            assert agent.service.worker_info().hardware == "H100 x2 (rack 7)"

    asyncio.run(body())


def test_sim_workers_of_one_gpu_count_and_speed_share_a_label_and_others_do_not():
    label = SimConfig(gpu="h100-sxm", tp=4).hardware_label()
    assert label == SimConfig(gpu="h100-sxm", tp=4, seed=7).hardware_label() == "simulated h100-sxm x4"
    assert label != SimConfig(gpu="h100-sxm", tp=2).hardware_label()
    assert label != SimConfig(gpu="h100-sxm", tp=4, speedup=4).hardware_label()  # its steps take a quarter of the wall time
    assert SimConfig(profile="p.json").hardware_label() == "simulated from profile p.json"


def test_a_sim_agent_states_its_modeled_link_and_the_agent_flag_overrides_it():
    """WorkerInfo.link_gb_per_s: what the control plane prices KV moves with before it has
    measured one (the reference engine cannot know its network and states none)."""

    async def body():
        async with serve_agent("ref", Role.BOTH) as agent:
            assert agent.service.worker_info().link_gb_per_s == 0.0
        sim = engines.create("sim", SimConfig(link="400gbe", num_blocks=64))
        async with serve_agent("sim", Role.BOTH, engine=sim) as agent:
            assert agent.service.worker_info().link_gb_per_s == 50.0  # 400 Gb/s
        sim = engines.create("sim", SimConfig(link="400gbe", num_blocks=64))
        async with serve_agent("sim", Role.BOTH, engine=sim, link_gb_per_s=12.5) as agent:
            assert agent.service.worker_info().link_gb_per_s == 12.5

    asyncio.run(body())
