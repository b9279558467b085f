"""Disaggregated serving end to end: prefill on one agent process, KV moved, decode on another."""

from __future__ import annotations

import pytest

from kvplane import Client
from kvplane.apps.cluster import LocalCluster

from .helpers import BLOCK_SIZE, prompt_ids

pytestmark = pytest.mark.cluster  # starts processes

TRANSPORTS = ["grpc", "nixl"]


def _available(transport: str) -> bool:
    from kvplane.dataplane.transport import available_transports

    return transport in available_transports()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_disaggregated_greedy_equals_local(transport):
    if not _available(transport):
        pytest.skip(f"{transport} transport is not available on this machine")
    prompt = prompt_ids(seed=1, length=5 * BLOCK_SIZE + 7)
    with LocalCluster(num_prefill=1, num_decode=1, agent_args=("--transports", transport)) as cluster:
        with Client(cluster.endpoint, timeout=60) as client:
            remote = client.generate(prompt, max_tokens=24, disagg="always")
            # Another cache salt: nothing cached, the same computation, done on one worker.
            local = client.generate(prompt, max_tokens=24, disagg="never", cache_salt="fresh")
            # The decode agent tells the relaying replica when the remote prefill ends (a message
            # without tokens); the caller gets tokens and the end only.
            chunks = list(client.stream(prompt, max_tokens=4, disagg="always", cache_salt="streamed"))
    assert chunks[-1].finished and chunks[-1].metrics.disaggregated
    assert all(c.token_ids or c.finished for c in chunks) and sum(len(c.token_ids) for c in chunks) == 4
    m = remote.metrics
    assert (m.prefill_worker, m.decode_worker, m.disaggregated) == ("prefill-0", "decode-0", True)
    assert m.transport == transport
    assert m.kv_transfer_blocks == 5  # every full prompt block moved; the 7-token tail is computed on decode
    assert m.kv_transfer_bytes == 5 * _block_nbytes(client_layout=cluster)
    assert local.metrics.disaggregated is False
    assert local.metrics.prefill_worker == local.metrics.decode_worker == "decode-0"
    assert len(remote.token_ids) == 24
    assert remote.token_ids == local.token_ids


def _block_nbytes(client_layout: LocalCluster) -> int:
    # Known from the built-in model: 2 layers x 2 KV heads x head_dim 16, float32.
    from kvplane.dataplane.engines.reference.config import EngineConfig
    from kvplane.dataplane.engines.reference.weights import builtin_model

    model = builtin_model(EngineConfig().seed)
    cfg = model.config
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4 * BLOCK_SIZE


def test_second_prompt_reuses_prefix_on_the_holder(disagg_cluster):
    """After a disaggregated request, its blocks live on both workers; a prompt sharing the prefix
    goes to the decode worker that holds it and computes only the uncached suffix."""
    shared = prompt_ids(seed=2, length=8 * BLOCK_SIZE)
    first_prompt = shared + prompt_ids(seed=3, length=5)
    second_prompt = shared + prompt_ids(seed=4, length=BLOCK_SIZE + 3)
    with Client(disagg_cluster.endpoint, timeout=60) as client:
        first = client.generate(first_prompt, max_tokens=4, disagg="never")
        assert first.metrics.cached_tokens == 0
        holder = first.metrics.decode_worker

        def index_has_prefix():
            return client.route(second_prompt, max_tokens=4, disagg="never").cached_tokens == len(shared)

        from .helpers import wait_for

        wait_for(index_has_prefix, timeout=5, what="the KV events of the first request to reach the index")
        second = client.generate(second_prompt, max_tokens=4, disagg="never")
    assert second.metrics.decode_worker == holder
    assert second.metrics.cached_tokens == len(shared)
    assert second.metrics.prefill_computed_tokens == len(second_prompt) - len(shared)


def test_auto_mode_of_a_cost_policy_uses_the_threshold():
    # The token threshold is the rule of the policies that price by a cost (Dynamo's conditional
    # disaggregation); kvplane decides by predicted seconds (tests/core/test_core_seconds.py).
    args = ("--routing-policy", "least-load", "--disagg-threshold", "64")
    with LocalCluster(num_prefill=1, num_decode=1, controlplane_args=args) as cluster:
        with Client(cluster.endpoint, timeout=60) as client:
            short = client.generate(prompt_ids(seed=5, length=20), max_tokens=2, disagg="auto")
            long = client.generate(prompt_ids(seed=6, length=100), max_tokens=2, disagg="auto")
    assert short.metrics.disaggregated is False and "threshold 64" in short.metrics.route_reason
    assert long.metrics.disaggregated is True and long.metrics.prefill_worker == "prefill-0"
