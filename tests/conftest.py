"""Shared test fixtures: a real etcd server on loopback.

`etcd_endpoint` (session-scoped) is one etcd for the whole run; tests sharing it must use their
own key prefix. `etcd_factory` starts fresh servers for tests that stop, kill or restart etcd.
`start_etcd(tmp_dir)` (kvplane/apps/local_etcd.py, where the launcher and its settings live) is the
plain function behind both. `etcd_cluster_factory` starts a three-member etcd cluster on loopback
(`start_etcd_cluster`), whose members tests kill and restart one by one. `nats_factory` starts a
fresh nats-server with JetStream (kvplane/apps/local_nats.py), the bus of several replicas.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from kvplane.apps.cluster import FREE_PORTS_ENV, free_port_range
from kvplane.apps.local_etcd import EtcdCluster, EtcdNotFound, EtcdServer, start_etcd, start_etcd_cluster
from kvplane.apps.local_nats import NatsNotFound, NatsServer, start_nats

__all__ = ["EtcdCluster", "EtcdServer", "bus_messages", "start_etcd", "start_etcd_cluster", "start_nats"]


@pytest.fixture(autouse=True)
def _processes_need_the_cluster_marker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A test that starts a process must carry @pytest.mark.cluster, so that `-m "not cluster"`
    stays the fast, process-free suite: outside the marker, starting one fails the test."""
    if request.node.get_closest_marker("cluster") is None:

        def refuse(*args, **kwargs):
            raise RuntimeError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.cluster")

        monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
        monkeypatch.setattr(os, "fork", refuse)
    yield


@pytest.fixture(autouse=True, scope="session")
def _kvplane_home(tmp_path_factory: pytest.TempPathFactory):
    """Local clusters publish their client credentials under $KVPLANE_HOME: a temporary one for the
    run, so tests never touch ~/.kvplane (children and CLI subprocesses inherit it)."""
    previous = os.environ.get("KVPLANE_HOME")
    os.environ["KVPLANE_HOME"] = str(tmp_path_factory.mktemp("kvplane-home"))
    yield
    if previous is None:
        os.environ.pop("KVPLANE_HOME", None)
    else:
        os.environ["KVPLANE_HOME"] = previous


@pytest.fixture(autouse=True, scope="session")
def _own_ports_per_test_process():
    """Under pytest-xdist (`make test`) each test process draws its children's ports from its own
    slice of free_port's range ($KVPLANE_FREE_PORTS, inherited by the launchers it starts), so two
    processes never hand one port to two children starting at the same time."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or FREE_PORTS_ENV in os.environ:
        yield
        return
    low, high = free_port_range()
    width = (high - low) // count
    start = low + int(worker[2:]) * width
    os.environ[FREE_PORTS_ENV] = f"{start}-{start + width}"
    yield
    del os.environ[FREE_PORTS_ENV]


def _start_or_fail(tmp_dir: Path) -> EtcdServer:
    try:
        return start_etcd(tmp_dir)
    except EtcdNotFound as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def etcd_endpoint(tmp_path_factory: pytest.TempPathFactory):
    """ "127.0.0.1:PORT" of one etcd shared by the whole test session."""
    server = _start_or_fail(tmp_path_factory.mktemp("etcd"))
    yield server.endpoint
    server.stop()


@pytest.fixture
def etcd_factory(tmp_path_factory: pytest.TempPathFactory):
    """Call it to start a fresh etcd (an EtcdServer); every server it started is stopped afterwards."""
    servers: list[EtcdServer] = []

    def start() -> EtcdServer:
        servers.append(_start_or_fail(tmp_path_factory.mktemp("etcd")))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def etcd_cluster_factory(tmp_path_factory: pytest.TempPathFactory):
    """Call it to start a fresh three-member etcd cluster (an EtcdCluster); stopped afterwards."""
    clusters: list[EtcdCluster] = []

    def start(num_members: int = 3) -> EtcdCluster:
        try:
            clusters.append(start_etcd_cluster(tmp_path_factory.mktemp("etcd-cluster"), num_members))
        except EtcdNotFound as err:
            pytest.fail(str(err), pytrace=False)
        return clusters[-1]

    yield start
    for cluster in clusters:
        cluster.stop()


@pytest.fixture
def nats_factory(tmp_path_factory: pytest.TempPathFactory):
    """Call it to start a fresh nats-server -js (a NatsServer); every server it started is stopped afterwards."""
    servers: list[NatsServer] = []

    def start() -> NatsServer:
        try:
            servers.append(start_nats(tmp_path_factory.mktemp("nats")))
        except NatsNotFound as err:
            pytest.fail(str(err), pytrace=False)
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


async def bus_messages(bus) -> asyncio.Queue:
    """Subscribes to `bus` (controlplane/bus/): what it delivers, in a queue to await."""
    messages: asyncio.Queue = asyncio.Queue()
    await bus.subscribe(messages.put_nowait)
    return messages
