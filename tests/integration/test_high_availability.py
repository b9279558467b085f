"""High availability on real processes: two control-plane replicas on a three-member etcd cluster
on loopback, under steady greedy traffic whose every output is checked against a clean run.

- one etcd member dies, then a second (quorum lost): requests keep succeeding on the replicas'
  last known state; both members return and everything converges (leases kept, new KV events
  indexed, a new agent registers and serves);
- a control-plane replica is SIGKILLed under load: the SDK, given both endpoints, fails over
  (resuming the streams the dead replica relayed), and new requests keep succeeding.
"""

from __future__ import annotations

import signal
import time

import pytest

from kvplane import Client
from kvplane.apps.cluster import LocalCluster

from .helpers import BLOCK_SIZE, Traffic, assert_nothing_pinned, cached_blocks, metric_sum, prompt_ids, scrape, wait_for

pytestmark = pytest.mark.cluster  # starts processes

NUM_PROMPTS = 6
MAX_TOKENS = 24


def test_replicas_on_a_three_member_etcd_ride_out_member_loss_quorum_loss_and_a_replica_kill(etcd_cluster_factory, tmp_path):
    etcd = etcd_cluster_factory()
    prompts = [prompt_ids(seed=80 + i, length=3 * BLOCK_SIZE) for i in range(NUM_PROMPTS)]
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=2, store=etcd.url, num_controlplanes=2, log_dir=tmp_path,
        # Every replica credits every worker's KV events, so each one's index shows the events it
        # applied (by default a replica credits only blocks it routed: tests/security/test_worker_claims.py).
        controlplane_args=("--lease-ttl", "6", "--trust-worker-cache-claims"),
    ) as cluster, Client(cluster.endpoint, timeout=60) as client:  # fmt: skip
        reference = [client.generate(p, max_tokens=MAX_TOKENS, ignore_eos=True).token_ids for p in prompts]
        metrics_urls = []
        for replica in cluster.controlplane_endpoints.values():
            with Client(replica, timeout=30) as one:
                metrics_urls.append(one.stats().metrics_url)

        def store_up() -> list[float]:  # kvplane_store_up of each replica (the KvplaneStoreDown alert's input)
            return [metric_sum(scrape(url), "kvplane_store_up") for url in metrics_urls]

        with Traffic(cluster.endpoint, prompts, reference, MAX_TOKENS) as traffic:
            assert traffic.count(2.0) > 0
            assert store_up() == [1.0, 1.0]

            etcd.members[0].kill()
            assert traffic.count(3.0) > 0, "no request completed with one etcd member down"
            etcd.members[1].kill()  # no quorum: the store is down
            assert traffic.count(6.0) > 0, "no request completed without etcd quorum"
            assert not traffic.failures, traffic.failures[:3]
            wait_for(lambda: store_up() == [0.0, 0.0], timeout=20, what="kvplane_store_up 0 on both replicas without quorum")

            etcd.members[0].restart()
            etcd.members[1].restart()
            etcd.wait_healthy()
            wait_for(lambda: store_up() == [1.0, 1.0], timeout=30, what="kvplane_store_up 1 again on both replicas")
            # Converged: both workers still registered (their leases outlived the outage) and
            # reporting, and new KV events reach the index of both replicas.
            wait_for(lambda: {w.worker_id for w in client.workers() if w.load_age_s < 1.0} == {"both-0", "both-1"},
                     timeout=30, what="both workers reporting again")  # fmt: skip
            fresh = prompt_ids(seed=99, length=5 * BLOCK_SIZE)
            holder = client.generate(fresh, max_tokens=2).metrics.decode_worker
            for replica in cluster.controlplane_endpoints.values():
                with Client(replica, timeout=30) as one:
                    wait_for(lambda one=one: one.route(fresh, max_tokens=2).cached_tokens >= 4 * BLOCK_SIZE,
                             timeout=20, what=f"the new prefix in {replica}'s index")  # fmt: skip
            assert cached_blocks(client, holder) > 0
            cluster.add_agent("both", "both-2")
            assert "both-2" in {w.worker_id for w in client.workers()}

            # A replica dies under load: the SDK fails over, streams resume on the other one.
            cluster.kill("controlplane", signal.SIGKILL)
            assert traffic.count(4.0) > 0, "no request completed after a replica died"
        assert traffic.wrong == [], f"outputs differed from the clean run for prompts {traffic.wrong}"
        assert not traffic.failures, traffic.failures[:3]
        assert_nothing_pinned(cluster, client)


def test_an_agent_keeps_its_lease_while_the_replica_it_talks_to_hangs(etcd_factory, tmp_path):
    """A hung (SIGSTOPped) replica: the agent's loops time out on it and move to the other one.
    A call still waiting on the hung replica when another loop had moved used to move the link
    back there, so the keep-alives kept going to the hung replica until the lease ran out and the
    worker left the registry for a moment (requests then failed with 'no workers are registered')."""
    etcd = etcd_factory()
    prompt = prompt_ids(seed=70, length=3 * BLOCK_SIZE)
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=1, store=etcd.url, num_controlplanes=2, log_dir=tmp_path,
        controlplane_args=("--lease-ttl", "3"),
    ) as cluster:  # fmt: skip
        hung, healthy = cluster.controlplane_endpoints  # the agent talks to the first one first
        # The replicas list the worker as soon as the store has it, which can be before the
        # agent has the reply to its Register: stopped in between, the agent never learns its
        # lease and cannot keep it (a race of this test, not the behaviour it checks).
        wait_for(lambda: "registered as both-0" in cluster.log_tail("both-0", 200), 30, what="the agent's own registration")
        cluster.kill(hung, signal.SIGSTOP)
        try:
            with Client(cluster.controlplane_endpoints[healthy], timeout=20) as client:
                deadline = time.monotonic() + 8.0  # over two lease TTLs
                while time.monotonic() < deadline:
                    assert len(client.generate(prompt, max_tokens=2).token_ids) == 2
                    time.sleep(0.2)
        finally:
            cluster.kill(hung, signal.SIGCONT)
        agent_log = (cluster.log_dir / "both-0.log").read_text()
        assert "switching to" in agent_log  # it did leave the hung replica
        assert "lease lost" not in agent_log, [line for line in agent_log.splitlines() if "lease lost" in line or "switching" in line]
