"""Two control-plane replicas on one etcd with NATS JetStream as their bus, on real processes.

Load reports and KV events reach both replicas through NATS and never touch etcd; a KV prefix a
worker computed through one replica is routed to by the other. nats-server is SIGKILLed under
steady greedy traffic (every output checked against a clean run): requests keep succeeding on the
replicas' last known state, also once the reports have stopped for longer than --silent-after-s
(the replicas tell a silent bus from silent workers), and once it is back the workers report again
and new KV events reach both replicas' indexes. With --bus-for-agents the agents publish their
load reports on NATS themselves, or through a replica when they cannot reach it.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest

from kvplane import Client
from kvplane.apps.cluster import LocalCluster, free_port
from kvplane.controlplane import keys
from kvplane.controlplane.store import open_store

from .helpers import BLOCK_SIZE, Traffic, assert_nothing_pinned, metric_sum, prompt_ids, scrape, wait_for

pytestmark = pytest.mark.cluster  # starts processes

MAX_TOKENS = 16
SILENT_AFTER_S = 1.5
WORKERS = {"both-0", "both-1"}


def _store_keys(url: str, prefix: str) -> list[str]:
    async def read():
        store = open_store(url)
        try:
            items, _ = await store.get_prefix(prefix)
            return [kv.key for kv in items]
        finally:
            await store.close()

    return asyncio.run(read())


def _reporting(endpoint: str) -> set[str]:
    with Client(endpoint, timeout=20) as client:
        return {w.worker_id for w in client.workers() if w.load_age_s < 1.0}


def _prefix_known_everywhere(cluster: LocalCluster, prompt: list[int], num_blocks: int) -> None:
    for replica in cluster.controlplane_endpoints.values():
        with Client(replica, timeout=30) as one:
            wait_for(lambda one=one: one.route(prompt, max_tokens=2).cached_tokens >= num_blocks * BLOCK_SIZE,
                     timeout=20, what=f"the prefix in {replica}'s index")  # fmt: skip


def test_two_replicas_share_load_and_kv_events_through_nats_and_ride_out_its_restart(etcd_factory, nats_factory, tmp_path):
    etcd, nats = etcd_factory(), nats_factory()
    prompts = [prompt_ids(seed=110 + i, length=3 * BLOCK_SIZE) for i in range(4)]
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=2, store=etcd.url, num_controlplanes=2, log_dir=tmp_path, bus=nats.url,
        # Every replica credits every worker's KV events, so each one's index shows the events it applied.
        controlplane_args=("--lease-ttl", "6", "--trust-worker-cache-claims", "--silent-after-s", str(SILENT_AFTER_S)),
    ) as cluster, Client(cluster.endpoint, timeout=60) as client:  # fmt: skip
        for replica in cluster.controlplane_endpoints.values():
            wait_for(lambda replica=replica: _reporting(replica) == WORKERS, timeout=30, what=f"both workers' reports at {replica}")
        first = prompt_ids(seed=120, length=5 * BLOCK_SIZE)
        client.generate(first, max_tokens=2)
        _prefix_known_everywhere(cluster, first, 4)
        for replica in cluster.controlplane_endpoints.values():
            with Client(replica, timeout=20) as one:
                metrics = scrape(one.stats().metrics_url)
            assert metric_sum(metrics, "kvplane_bus_up") == 1
            assert metric_sum(metrics, "kvplane_bus_messages_total", kvplane_bus_kind="load") > 0
            assert metric_sum(metrics, "kvplane_bus_messages_total", kvplane_bus_kind="kv") > 0
        # Neither kind of message is a store key.
        assert _store_keys(etcd.url, keys.LOAD) == [] and _store_keys(etcd.url, keys.KV) == []
        assert len(_store_keys(etcd.url, keys.WORKERS)) == 2

        reference = [client.generate(p, max_tokens=MAX_TOKENS, ignore_eos=True).token_ids for p in prompts]
        with Traffic(cluster.endpoint, prompts, reference, MAX_TOKENS) as traffic:
            assert traffic.count(2.0) > 0
            nats.kill()
            time.sleep(SILENT_AFTER_S + 0.5)
            assert traffic.count(3.0) > 0, "no request completed while the bus was down"
            nats.restart()
            for replica in cluster.controlplane_endpoints.values():
                wait_for(lambda replica=replica: _reporting(replica) == WORKERS, timeout=30, what=f"reports at {replica} again")
            fresh = prompt_ids(seed=121, length=5 * BLOCK_SIZE)
            client.generate(fresh, max_tokens=2)
            _prefix_known_everywhere(cluster, fresh, 4)
            assert traffic.count(2.0) > 0
        assert traffic.wrong == [], f"outputs differed from the clean run for prompts {traffic.wrong}"
        assert not traffic.failures, traffic.failures[:3]
        assert_nothing_pinned(cluster, client)


def _agent_publishes(nats) -> dict[str, int]:
    """Messages each agent's own NATS connection published (nats-server's monitoring, /connz)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{nats.monitor_port}/connz", timeout=5) as reply:
        connections = json.load(reply)["connections"]
    return {c["name"].removeprefix("kvplane-agent "): c["in_msgs"] for c in connections if c.get("name", "").startswith("kvplane-agent ")}


def _keepalives(cluster: LocalCluster) -> dict[str, float]:
    """Agents' keep-alives the replicas took from the bus, by outcome, summed over the replicas."""
    totals: dict[str, float] = {}
    for replica in cluster.controlplane_endpoints.values():
        with Client(replica, timeout=20) as one:
            metrics = scrape(one.stats().metrics_url)
        for outcome in ("renewed", "lost", "mac", "replayed", "store"):
            totals[outcome] = totals.get(outcome, 0) + metric_sum(metrics, "kvplane_bus_keepalives_total", kvplane_bus_outcome=outcome)
    return totals


def _leases(url: str) -> dict[str, int]:
    async def read():
        store = open_store(url)
        try:
            items, _ = await store.get_prefix(keys.WORKERS)
            return {kv.key: kv.lease for kv in items}
        finally:
            await store.close()

    return asyncio.run(read())


def test_agents_publish_their_load_reports_on_the_bus_themselves_and_both_replicas_read_them(etcd_factory, nats_factory, tmp_path):
    """And renew their leases there: with 3 s leases, six renewals or more and the same leases
    after 2.5 TTLs, and every keep-alive a replica took was renewed."""
    etcd, nats = etcd_factory(), nats_factory()
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=2, store=etcd.url, num_controlplanes=2, log_dir=tmp_path, bus=nats.url,
        controlplane_args=("--bus-for-agents", nats.url, "--trust-worker-cache-claims", "--lease-ttl", "3"),  # each replica credits what it applies
    ) as cluster, Client(cluster.endpoint, timeout=60) as client:  # fmt: skip
        for replica in cluster.controlplane_endpoints.values():
            wait_for(lambda replica=replica: _reporting(replica) == WORKERS, timeout=30, what=f"both workers' reports at {replica}")
        wait_for(lambda: set(_agent_publishes(nats)) == WORKERS and min(_agent_publishes(nats).values()) >= 5, timeout=20,
                 what="reports published by the agents' own NATS connections")  # fmt: skip
        leases = _leases(etcd.url)
        assert len(leases) == 2
        time.sleep(7.5)
        assert _leases(etcd.url) == leases
        keepalives = _keepalives(cluster)
        assert keepalives["renewed"] >= 6 and keepalives["renewed"] == sum(keepalives.values()), keepalives
        # KV batches still go through a replica (it checks their limits); routing works on both.
        first = prompt_ids(seed=130, length=5 * BLOCK_SIZE)
        assert len(client.generate(first, max_tokens=4, ignore_eos=True).token_ids) == 4
        _prefix_known_everywhere(cluster, first, 4)
        for replica in cluster.controlplane_endpoints.values():
            with Client(replica, timeout=20) as one:
                metrics = scrape(one.stats().metrics_url)
            assert metric_sum(metrics, "kvplane_bus_messages_total", kvplane_bus_kind="load") > 0
        assert_nothing_pinned(cluster, client)


def test_agents_that_cannot_reach_the_bus_they_are_given_report_through_a_replica(etcd_factory, nats_factory, tmp_path):
    etcd, nats = etcd_factory(), nats_factory()
    unreachable = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=2, store=etcd.url, log_dir=tmp_path, bus=nats.url,
        controlplane_args=("--bus-for-agents", unreachable),
    ) as cluster:  # fmt: skip
        wait_for(lambda: _reporting(cluster.endpoint) == WORKERS, timeout=30, what="both workers' reports, through the replica")
        assert _agent_publishes(nats) == {}
