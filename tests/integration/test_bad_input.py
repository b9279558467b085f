"""Bad input gets the right status and a clear message, and the servers keep serving."""

from __future__ import annotations

import grpc
import pytest

from kvplane import Client
from kvplane.errors import FailedPreconditionError, InvalidArgumentError, KvplaneError
from kvplane.v1 import agent_pb2, agent_pb2_grpc

from .helpers import prompt_ids

pytestmark = pytest.mark.cluster  # starts processes


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt=""), "prompt is empty"),
        (dict(prompt=[]), "prompt is empty"),
        (dict(prompt=[1, 2, 3], max_tokens=0), "max_tokens must be at least 1"),
        (dict(prompt=[1, 2, 3], max_tokens=100_000), "above this model's limit"),
        (dict(prompt=[1] * 5000, max_tokens=8), "exceeds the context"),
        (dict(prompt=[1, 2, 100_000], max_tokens=8), "outside the vocabulary"),
        (dict(prompt=[1, 2, 3], model="no-such-model"), "unknown model 'no-such-model'"),
    ],
)
def test_invalid_requests_are_refused_and_serving_continues(disagg_cluster, kwargs, message):
    with Client(disagg_cluster.endpoint, timeout=30) as client:
        prompt = kwargs.pop("prompt")
        with pytest.raises(InvalidArgumentError) as info:
            client.generate(prompt, **kwargs)
        assert message in str(info.value)
        ok = client.generate(prompt_ids(seed=9, length=10), max_tokens=3)
    assert len(ok.token_ids) == 3


def test_agents_refuse_requests_without_a_control_plane_ticket(disagg_cluster):
    """Even the control plane's own identity needs a ticket for work (the full set of attacks is in
    tests/security)."""
    from kvplane.grpc_util import aio_channel
    from kvplane.security.local import CONTROLPLANE

    async def call():
        async with aio_channel(
            disagg_cluster.worker_endpoints["decode-0"], disagg_cluster.credentials.for_identity(CONTROLPLANE)
        ) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.Generate(agent_pb2.AgentGenerateRequest(prompt_token_ids=[1, 2, 3])):
                    pass
            return info.value

    import asyncio

    error = asyncio.run(call())
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "ticket" in error.details()


def test_layout_mismatch_on_transfer_is_a_failed_precondition(tmp_path):
    """A prefill agent whose KV dtype differs from the decode agent's refuses the transfer,
    naming the field; the decode agent does not silently recompute."""
    from kvplane.apps.cluster import LocalCluster

    with LocalCluster(num_prefill=0, num_decode=1, log_dir=tmp_path) as cluster:
        cluster.add_agent("prefill", "prefill-bf16", ("--dtype", "bfloat16"))
        with Client(cluster.endpoint, timeout=60) as client:
            with pytest.raises(FailedPreconditionError) as info:
                client.generate(prompt_ids(seed=10, length=40), max_tokens=2, disagg="always")
            assert "KV layout mismatch on dtype" in str(info.value)
            # Still serving: the same request prefilled locally works.
            ok = client.generate(prompt_ids(seed=10, length=40), max_tokens=2, disagg="never")
    assert len(ok.token_ids) == 2
    assert isinstance(info.value, KvplaneError)
