"""Agent.Profile and the online step-time model on a real worker: a real Agent service over
loopback gRPC with a real engine (builtin-tiny on CPU); the test plays the control plane.

The online model's test profiles the worker, then runs real prefills of lengths the profile did
not use (some chunked, one behind a cached prefix): each is counted in the steps the model learns
from, and its predictions order as the work does. Their error against the measured steps is
printed (-s), not asserted: it depends on what else the machine runs (`kvplane bench calibrate`
measures it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import grpc
import pytest

from kvplane import tickets
from kvplane.dataplane.engines.reference import EngineConfig
from kvplane.latency import StepTimeModel, samples_from_pb, samples_to_pb
from kvplane.types import Role
from kvplane.v1 import agent_pb2, common_pb2

from .helpers import op_ticket, serve_agent, ticketed

WORKER = "both-t"
CHUNK = 512  # max_num_batched_tokens: prompts above it prefill in chunks


@contextlib.asynccontextmanager
async def agent(**engine_overrides):
    engine_config = EngineConfig(**{"num_blocks": 256, "max_num_batched_tokens": CHUNK, "max_num_seqs": 8, **engine_overrides})
    async with serve_agent(WORKER, Role.BOTH, engine_config=engine_config, transports=()) as running:
        yield running.service, running.engine, running.stub


async def generate(stub, request_id: str, prompt: list[int], max_tokens: int = 1, cache_salt: str = "") -> common_pb2.RequestMetrics:
    request = agent_pb2.AgentGenerateRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        cache_salt=cache_salt,
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )
    ticketed(request, WORKER)
    last = None
    async for reply in stub.Generate(request):
        last = reply
    assert last is not None and last.finished
    return last.metrics


def test_profile_returns_samples_and_a_model_and_seeds_the_online_model():
    async def body():
        async with agent() as (service, engine, stub):
            started = time.monotonic()
            reply = await stub.Profile(
                agent_pb2.ProfileRequest(ticket=op_ticket(tickets.PROFILE, WORKER), max_prompt_tokens=600, max_batch=4)
            )
            elapsed = time.monotonic() - started
            samples = samples_from_pb(reply.profile)
            # ~1 s on 2 idle cores (a default profile ~2 s); only a sanity bound, other processes share the cores.
            assert elapsed < 60 and abs(reply.profile.measured_at - time.time()) < 60
            model = StepTimeModel.from_pb(reply.model)
            assert model is not None and model.seeded_from_profile and model.num_samples == len(samples)
            # Prefills up to 600 tokens (chunked at 512), prefix-cached extensions, decode batches 1..4.
            assert max(s.prefill_tokens for s in samples) == CHUNK
            assert any(s.prefill_tokens and s.prefill_attention > s.prefill_tokens**2 for s in samples)  # context before
            assert {s.decode_seqs for s in samples} >= {1, 2, 3, 4} and max(s.decode_seqs for s in samples) == 4
            assert all(s.seconds > 0 for s in samples)
            # More time for more work.
            assert model.prefill_seconds(600, 0, CHUNK) > model.prefill_seconds(50, 0, CHUNK)
            # The agent's own online model now starts from the profile.
            online = service.latency_model()
            assert online is not None and online.seeded_from_profile
            assert online.coefficients == model.coefficients
            # Nothing of the profile is left behind in the pool except unreferenced cache.
            load = engine.load()
            assert load.num_running == load.num_waiting == 0 and load.num_used_blocks == 0

    asyncio.run(body())


def test_profile_defaults_and_concurrent_traffic():
    async def body():
        async with agent(max_num_seqs=4) as (service, engine, stub):
            # Traffic while profiling keeps being served; its steps simply add samples.
            profile = asyncio.ensure_future(stub.Profile(agent_pb2.ProfileRequest(ticket=op_ticket(tickets.PROFILE, WORKER))))
            metrics = await generate(stub, "live-1", list(range(1, 200)), max_tokens=8)
            assert metrics.prompt_tokens == 199
            reply = await profile
            samples = samples_from_pb(reply.profile)
            # Defaults: prompts up to min(1024, max_context / 2) = 1024 (in chunks of 512), batches up to max_num_seqs.
            assert sum(1 for s in samples if s.prefill_tokens == CHUNK) >= 2
            assert max(s.decode_seqs for s in samples) >= 4

    asyncio.run(body())


def test_profile_is_refused_while_draining():
    async def body():
        async with agent() as (service, engine, stub):
            await stub.Drain(agent_pb2.DrainRequest(ticket=op_ticket(tickets.DRAIN, WORKER)))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Profile(agent_pb2.ProfileRequest(ticket=op_ticket(tickets.PROFILE, WORKER)))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "draining" in info.value.details()
            assert engine.profiling.take_step_timings() == []  # no work was spent

    asyncio.run(body())


def test_worker_load_and_a_stored_profile_seed():
    async def body():
        async with agent() as (service, engine, stub):
            load = service.worker_load()
            assert list(load.running_remaining_tokens) == [] and load.running_context_tokens == 0
            assert service.latency_model_pb() is None  # nothing measured yet
            reply = await stub.Profile(
                agent_pb2.ProfileRequest(ticket=op_ticket(tickets.PROFILE, WORKER), max_prompt_tokens=128, max_batch=2)
            )
            # A fresh agent seeded from the stored profile (what registration hands back) agrees.
            async with agent() as (other, _, _):
                other.seed_latency(reply.profile)
                assert other.latency_model_pb() == reply.model
                other.seed_latency(samples_to_pb([], 0.0))  # an empty stored profile changes nothing
                assert other.latency_model_pb() == reply.model

    asyncio.run(body())


def test_online_model_predicts_every_prefill_from_the_steps_it_ran():
    """Profile, then prefill new lengths for real: every prefill is counted in the steps the model
    learns from, and its predictions grow with the new tokens and shrink with a cached prefix.

    How close the predictions come to the measured times depends on what else this machine runs
    (another process can only slow a step down): that is measured by `kvplane bench calibrate`,
    not asserted here. The errors are printed (pytest -s)."""

    async def body():
        async with agent() as (service, engine, stub):
            await stub.Profile(agent_pb2.ProfileRequest(ticket=op_ticket(tickets.PROFILE, WORKER), max_prompt_tokens=1024, max_batch=8))
            # New lengths (the profile's are multiples of 16 = 1024/64); 700 and 1000 prefill in
            # two chunks; the last case is 354 new tokens behind a cached prefix of 496.
            cases = [(40, 0), (150, 0), (300, 0), (450, 0), (700, 0), (1000, 0), (354, 496)]
            predicted: dict[tuple[int, int], float] = {}
            print("\nnew tokens  cached  predicted ms  measured ms  error")
            for k, (new, cached) in enumerate(cases):
                tag = uuid.uuid4().hex
                prompt = [(3 * j + k) % 250 + 1 for j in range(new + cached)]
                if cached:
                    await generate(stub, f"prefix-{tag}", prompt[:500], cache_salt=tag)
                model = service.latency_model()  # the online model: the profile seed plus every step since
                service.collect_step_timings()
                metrics = await generate(stub, f"new-{tag}", prompt, cache_salt=tag)
                steps = service.collect_step_timings()
                assert metrics.cached_tokens == cached and metrics.prefill_computed_tokens == new
                assert sum(s.prefill_tokens for s in steps) == new
                predicted[(new, cached)] = model.prefill_seconds(new, cached, CHUNK)
                measured = sum(s.seconds for s in steps)
                print(f"{new:10d}  {cached:6d}  {predicted[(new, cached)] * 1000:12.2f}  {measured * 1000:11.2f}  "
                      f"{abs(predicted[(new, cached)] - measured) / measured:6.1%}")  # fmt: skip
            uncached = [predicted[case] for case in cases if case[1] == 0]
            assert all(0 < a < b for a, b in zip(uncached, uncached[1:])), uncached
            # 354 new tokens behind 496 cached cost less than computing all 850, and more than 300 alone.
            assert predicted[(300, 0)] < predicted[(354, 496)] < model.prefill_seconds(850, 0, CHUNK)

    asyncio.run(body())
