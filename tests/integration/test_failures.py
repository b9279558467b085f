"""Failures on the etcd backend: a SIGKILLed worker vanishes by lease expiry; a restarted
control plane rebuilds its view (workers and cache index) from etcd alone."""

from __future__ import annotations

import signal
import time

import pytest

from kvplane import Client
from kvplane.apps.cluster import LocalCluster

from .helpers import BLOCK_SIZE, cached_blocks, prompt_ids, wait_for

pytestmark = pytest.mark.cluster  # starts processes

LEASE_TTL_S = 3


def test_sigkilled_worker_vanishes_within_ttl_and_requests_still_succeed(etcd_factory, tmp_path):
    etcd = etcd_factory()
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=2, store=etcd.url, log_dir=tmp_path,
        controlplane_args=("--lease-ttl", str(LEASE_TTL_S)),
    ) as cluster, Client(cluster.endpoint, timeout=60) as client:  # fmt: skip
        prompt = prompt_ids(seed=20, length=6 * BLOCK_SIZE)
        first = client.generate(prompt, max_tokens=4, disagg="never")
        victim = first.metrics.decode_worker
        survivor = next(w for w in ("both-0", "both-1") if w != victim)
        wait_for(lambda: cached_blocks(client, victim) > 0, timeout=5, what="the victim's KV events in the index")

        cluster.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(
            lambda: victim not in {w.worker_id for w in client.workers()},
            timeout=LEASE_TTL_S + 2, interval=0.05, what=f"{victim} to leave the registry",
        )  # fmt: skip
        gone_after = time.monotonic() - killed_at
        assert gone_after <= LEASE_TTL_S + 2
        assert victim not in {wc.worker_id for wc in client.cache()}

        again = client.generate(prompt, max_tokens=4, disagg="never")
        assert again.metrics.decode_worker == survivor
        assert again.token_ids == first.token_ids


def test_restarted_control_plane_rebuilds_routing_from_etcd(etcd_factory, tmp_path):
    etcd = etcd_factory()
    # The restarted replica credits what it rebuilt from etcd (by default it would credit only
    # blocks it routed itself, and route the first request per prefix by load: docs/security.md).
    with LocalCluster(
        num_prefill=0, num_decode=0, num_both=2, store=etcd.url, log_dir=tmp_path, controlplane_args=("--trust-worker-cache-claims",),
    ) as cluster, Client(cluster.endpoint, timeout=60) as client:  # fmt: skip
        shared = prompt_ids(seed=21, length=10 * BLOCK_SIZE)
        first = client.generate(shared + [1, 2, 3], max_tokens=2, disagg="never")
        holder = first.metrics.decode_worker
        probe = shared + [7, 8, 9, 10]
        wait_for(lambda: client.route(probe, max_tokens=2).cached_tokens == len(shared), timeout=5, what="the index")

        cluster.restart_controlplane()
        # A fresh process: everything it knows came from etcd.
        route = wait_for(lambda: _route_or_none(client, probe), timeout=20, what="the new control plane to serve")
        assert route.decode_worker == holder
        assert route.cached_tokens == len(shared)
        second = client.generate(probe, max_tokens=2, disagg="never")
        assert second.metrics.decode_worker == holder
        assert second.metrics.cached_tokens == len(shared)


def _route_or_none(client, prompt):
    from kvplane.errors import KvplaneError

    try:
        route = client.route(prompt, max_tokens=2)
    except KvplaneError:
        return None
    return route if route.cached_tokens else None


def test_dead_prefill_worker_falls_back_to_local_prefill(tmp_path):
    """Within the lease TTL the router still sees the killed prefill worker; the decode agent's
    Prefill call fails and it prefills locally, so the caller still gets its tokens."""
    with LocalCluster(num_prefill=1, num_decode=1, log_dir=tmp_path) as cluster, Client(cluster.endpoint, timeout=60) as client:
        prompt = prompt_ids(seed=22, length=3 * BLOCK_SIZE)
        expected = client.generate(prompt, max_tokens=6, disagg="never", cache_salt="reference")
        cluster.kill("prefill-0", signal.SIGKILL)
        cluster.processes["prefill-0"].wait(timeout=10)
        result = client.generate(prompt, max_tokens=6, disagg="always")
    assert result.metrics.disaggregated is False
    assert result.metrics.prefill_worker == result.metrics.decode_worker == "decode-0"
    assert result.token_ids == expected.token_ids
