"""Request-level faults end one request cleanly and leak nothing (issue #12, items 1, 2, 4, 7, 9):
bad sampling values are refused or made greedy, malformed protobuf is INVALID_ARGUMENT, huge text
prompts are refused before tokenizing, cancelled remote prefills release their pins, and a dead
decode worker is a retryable UNAVAILABLE that names it."""

from __future__ import annotations

import asyncio
import signal
import threading

import grpc
import pytest

from kvplane import Client, grpc_util
from kvplane.apps.cluster import LocalCluster
from kvplane.errors import InvalidArgumentError, KvplaneError, RejectedError, UnavailableError

from .helpers import BLOCK_SIZE, agent_load, assert_nothing_pinned, prompt_ids

pytestmark = pytest.mark.cluster  # starts processes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(
        num_prefill=1, num_decode=1, log_dir=tmp_path_factory.mktemp("faults"),
        controlplane_args=("--disagg-threshold", "64"),
    ) as cluster:  # fmt: skip
        yield cluster


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1.0])
def test_non_finite_temperature_is_refused_while_other_streams_finish(cluster, temperature):
    prompts = [prompt_ids(seed=40 + i, length=20) for i in range(4)]
    with Client(cluster.endpoint, timeout=60) as client:
        expected = [client.generate(p, max_tokens=12).token_ids for p in prompts]
        results: list = [None] * 4

        def run(i):
            results[i] = client.generate(prompts[i], max_tokens=12).token_ids

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        with pytest.raises(InvalidArgumentError, match="temperature must be a finite number >= 0"):
            client.generate(prompts[0], max_tokens=12, temperature=temperature)
        for t in threads:
            t.join(60)
    assert results == expected


def test_a_sub_epsilon_temperature_is_greedy(cluster):
    prompt = prompt_ids(seed=45, length=20)
    with Client(cluster.endpoint, timeout=60) as client:
        greedy = client.generate(prompt, max_tokens=10).token_ids
        assert client.generate(prompt, max_tokens=10, temperature=1e-45).token_ids == greedy


def test_malformed_protobuf_is_invalid_argument_and_serving_continues(cluster):
    """Every server answers undecodable request bytes with INVALID_ARGUMENT (the caller passes the
    TLS handshake with the cluster's admin certificate; the parse check runs before the role check)."""
    garbage = b"\x0a\xff\xff\xff\xff\x0f"
    admin = cluster.credentials.admin

    async def call(endpoint, method, streaming):
        async with grpc_util.aio_channel(endpoint, admin) as channel:
            make = channel.unary_stream if streaming else channel.unary_unary
            rpc = make(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                if streaming:
                    async for _ in rpc(garbage, timeout=10):
                        pass
                else:
                    await rpc(garbage, timeout=10)
            return info.value

    for endpoint, method, streaming in [
        (cluster.endpoint, "/kvplane.v1.Kvplane/Generate", True),
        (cluster.endpoint, "/kvplane.v1.Kvplane/Route", False),
        (cluster.endpoint, "/kvplane.v1.Registry/ReportLoad", False),
        (cluster.worker_endpoints["prefill-0"], "/kvplane.v1.Agent/Prefill", False),
        (cluster.worker_endpoints["decode-0"], "/kvplane.v1.Agent/Generate", True),
    ]:
        error = asyncio.run(call(endpoint, method, streaming))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, error)
        assert "the request is not a valid message of this method" in error.details()
    with Client(cluster.endpoint, timeout=60) as client:
        assert len(client.generate(prompt_ids(seed=46, length=10), max_tokens=3).token_ids) == 3


def test_a_huge_text_prompt_is_refused_before_tokenizing_and_leases_survive(cluster):
    """Above --max-prompt-bytes (1 MiB) the control plane refuses the text before tokenizing it
    (it tokenizes every prompt itself; no worker sees text); above the servers' 8 MiB message limit
    gRPC refuses it before any handler runs. Leases survive all of it."""
    large, huge = "x" * (4 << 20), "x" * (30 << 20)
    with Client(cluster.endpoint, timeout=60) as client:
        with pytest.raises(InvalidArgumentError, match=r"larger than this cluster's limit of 1048576 bytes"):
            client.generate(large, max_tokens=4)
        with pytest.raises(RejectedError):
            client.generate(huge, max_tokens=4)
        assert {w.worker_id for w in client.workers()} == {"prefill-0", "decode-0"}
        assert client.generate("a short text prompt", max_tokens=3).token_ids


def test_cancelled_remote_prefills_release_every_pin(cluster):
    """Callers give up (deadlines) while their prompts are being prefilled remotely: nothing stays
    pinned on either worker, and the next disaggregated request runs at once."""
    prompts = [prompt_ids(seed=100 + i, length=60 * BLOCK_SIZE) for i in range(16)]
    errors: list[Exception] = []

    def impatient(i):
        with Client(cluster.endpoint, timeout=0.05 + 0.04 * (i % 8)) as c:
            try:
                c.generate(prompts[i], max_tokens=4, disagg="always")
            except KvplaneError as e:
                errors.append(e)

    threads = [threading.Thread(target=impatient, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors, "no request was cut short; the test needs shorter deadlines"
    with Client(cluster.endpoint, timeout=60) as client:
        assert_nothing_pinned(cluster, client)
        result = client.generate(prompt_ids(seed=99, length=20 * BLOCK_SIZE), max_tokens=4, disagg="always")
    assert result.metrics.disaggregated and result.metrics.prefill_worker == "prefill-0"


def test_a_request_right_after_its_decode_worker_died_is_unavailable_naming_it(tmp_path):
    with LocalCluster(num_prefill=1, num_decode=1, log_dir=tmp_path) as cluster, Client(cluster.endpoint, timeout=60) as client:
        cluster.kill("decode-0", signal.SIGKILL)
        cluster.processes["decode-0"].wait(timeout=10)
        for disagg in ("always", "auto"):
            with pytest.raises(UnavailableError) as info:
                client.generate(prompt_ids(seed=47, length=10), max_tokens=3, disagg=disagg)
            message = str(info.value)
            assert "decode-0" in message and "cannot reach the kvplane control plane" not in message, message
        assert agent_load(cluster, "prefill-0").num_pinned_blocks == 0


def test_a_stalled_prefill_peer_is_waited_for_no_longer_than_the_request_deadline(cluster):
    """The decode side used to wait up to 120 s for a stopped prefill worker; now the caller's
    deadline bounds it, and once the peer runs again nothing stays pinned on either side."""
    import time

    prompt = prompt_ids(seed=48, length=20 * BLOCK_SIZE)
    cluster.kill("prefill-0", signal.SIGSTOP)
    try:
        with Client(cluster.endpoint, timeout=3) as client:
            started = time.monotonic()
            with pytest.raises(KvplaneError):
                client.generate(prompt, max_tokens=4, disagg="always")
            assert time.monotonic() - started < 5
    finally:
        cluster.kill("prefill-0", signal.SIGCONT)
    with Client(cluster.endpoint, timeout=60) as client:
        assert_nothing_pinned(cluster, client)
        assert len(client.generate(prompt, max_tokens=4, disagg="always").token_ids) == 4
