"""Sim-engine agents in real processes: KV crosses the real transport with a scaled-down payload
and reports the modeled bytes and link time; greedy tokens match wherever the request ran."""

from __future__ import annotations

import pytest

from kvplane import Client, hardware
from kvplane.cluster import LocalCluster

pytestmark = pytest.mark.cluster

SIM_ARGS = ("--engine", "sim", "--sim-model", "llama-3-8b", "--sim-gpu", "h100", "--sim-tp", "1", "--sim-link", "100gbe")


def test_a_disaggregated_request_moves_the_modeled_kv_over_the_modeled_link():
    prompt = list(range(1, 2001))  # 125 full blocks of 16 tokens
    with LocalCluster(num_prefill=1, num_decode=1, agent_args=SIM_ARGS) as cluster, Client(cluster.endpoint, timeout=30) as client:
        remote = client.generate(prompt, max_tokens=6, disagg="always")
        local = client.generate(list(range(3, 2003)), max_tokens=6, disagg="never")
        again = client.generate(prompt, max_tokens=6, disagg="never")
    m = remote.metrics
    block_bytes = hardware.model("llama-3-8b").layout(16).block_nbytes
    assert m.disaggregated and m.transport == "grpc" and m.kv_transfer_blocks == 125
    assert m.kv_transfer_bytes == 125 * block_bytes == 262_144_000
    modeled_ms = hardware.link("100gbe").transfer_seconds(262_144_000) * 1000  # 21 ms
    assert modeled_ms <= m.kv_transfer_ms < modeled_ms + 1000
    # The decode worker now holds the prompt: run there without a transfer, same greedy tokens.
    assert again.metrics.decode_worker == "decode-0" and again.metrics.cached_tokens == 1984
    assert again.token_ids == remote.token_ids and local.token_ids != remote.token_ids
