"""KV event batches lost on purpose (agent --fault-injection, SIGUSR1 drops the next batch): the
control plane sees the gap in the sequence numbers, asks the agent for a snapshot, and the cache
index converges to what the worker holds, well before the periodic snapshot (10 s) would."""

from __future__ import annotations

import signal
import time

import pytest

from kvplane import Client
from kvplane.apps.cluster import LocalCluster

from .helpers import BLOCK_SIZE, agent_load, prompt_ids, wait_for

pytestmark = pytest.mark.cluster  # starts processes


def _index_matches_worker(cluster, client, worker_id: str) -> bool:
    indexed = next((c.blocks_by_tier.get("device", 0) for c in client.cache() if c.worker_id == worker_id), 0)
    return indexed == agent_load(cluster, worker_id).num_cached_blocks


def test_dropped_kv_batches_trigger_a_resync_and_the_index_converges(tmp_path):
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=1, log_dir=tmp_path, agent_args=("--fault-injection",),
    ) as cluster, Client(cluster.endpoint, timeout=60) as client:  # fmt: skip
        _lose_two_batches_and_converge(cluster, client)


def test_an_agent_publishing_its_reports_on_the_bus_learns_of_the_gap_from_its_keep_alive(nats_factory, tmp_path):
    """No answer comes back to a report or a batch published on the bus (--bus-for-agents): the
    snapshot request rides on the keep-alive's answer (every third of the lease TTL, 1 s here), and
    the snapshot goes on the bus too."""
    nats = nats_factory()
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=1, log_dir=tmp_path, agent_args=("--fault-injection",), bus=nats.url,
        controlplane_args=("--bus-for-agents", nats.url, "--lease-ttl", "3"),
    ) as cluster, Client(cluster.endpoint, timeout=60) as client:  # fmt: skip
        wait_for(lambda: "publishing load reports and KV event batches to the bus" in cluster.log_paths["both-0"].read_text(),
                 timeout=10, what="the agent on the bus")  # fmt: skip
        _lose_two_batches_and_converge(cluster, client)
        # Its batches and the snapshots asked for went on the bus, none through a replica.
        assert "sending it through a replica" not in cluster.log_paths["both-0"].read_text()


def _lose_two_batches_and_converge(cluster: LocalCluster, client: Client) -> None:
    client.generate(prompt_ids(seed=90, length=4 * BLOCK_SIZE), max_tokens=2)
    wait_for(lambda: _index_matches_worker(cluster, client, "both-0"), timeout=10, what="the index to hold the first prompt")
    for round_ in range(2):  # twice: the second gap must be found as well as the first
        cluster.kill("both-0", signal.SIGUSR1)
        time.sleep(0.3)
        lost = prompt_ids(seed=91 + round_, length=6 * BLOCK_SIZE)
        client.generate(lost, max_tokens=2)  # its events go in the dropped batch
        time.sleep(0.3)
        client.generate(prompt_ids(seed=95 + round_, length=3 * BLOCK_SIZE), max_tokens=2)  # the next batch shows the gap
        started = time.monotonic()
        wait_for(lambda: _index_matches_worker(cluster, client, "both-0"), timeout=8, what="the index to converge")
        assert time.monotonic() - started < 8
        assert client.route(lost + [1, 2, 3], max_tokens=2).cached_tokens == len(lost)
    agent_log = cluster.log_paths["both-0"].read_text()
    assert agent_log.count("fault injection: dropped KV event batch") == 2
    assert agent_log.count("asked for a KV snapshot") >= 2
    assert cluster.log_paths["controlplane"].read_text().count("gap in the KV events of both-0") >= 2
