"""Full-cluster tests (marked `cluster`): real control plane and agent processes on loopback.

They need the server modules (controlplane.main, dataplane.agent.main and what they import)
and skip with the list of missing modules until those exist in the checkout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvplane.apps.cluster import ClusterError, LocalCluster, free_port
from kvplane.client import Client
from tests.cli.conftest import REPO_ROOT, missing_server_modules, run_kvplane

pytestmark = pytest.mark.cluster
needs_servers = pytest.mark.skipif(bool(missing_server_modules()), reason=f"server modules missing: {missing_server_modules()}")


def _children_of(pid: int) -> set[int]:
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            children.add(int(stat.parent.name))
    return children


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@needs_servers
def test_up_serves_then_sigterm_stops_every_child(tmp_path: Path) -> None:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    up = subprocess.Popen(
        [sys.executable, "-m", "kvplane", "up", "--port", str(port), "--prefill", "1", "--decode", "1",
         "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    try:
        first_line = up.stdout.readline()  # blocks until every agent registered (or `up` failed)
        assert re.fullmatch(rf"kvplane cluster ready at 127\.0\.0\.1:{port}\n", first_line), (
            first_line + up.stderr.read() if up.poll() is not None else first_line
        )
        children = _children_of(up.pid)
        assert len(children) == 3  # control plane + 2 agents
        workers = json.loads(run_kvplane("workers", "--json", "--endpoint", f"127.0.0.1:{port}").stdout)
        assert sorted(w["id"] for w in workers) == ["decode-0", "prefill-0"]

        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=30) == 0
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in children if _alive(pid)]
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


@needs_servers
def test_local_cluster_generates_and_stops(tmp_path: Path) -> None:
    with LocalCluster(num_prefill=1, num_decode=1, controlplane_args=("--disagg-threshold", "32"),
                      log_dir=tmp_path) as cluster:  # fmt: skip
        assert set(cluster.processes) == {"controlplane", "prefill-0", "decode-0"}
        assert set(cluster.worker_endpoints) == {"prefill-0", "decode-0"}
        with Client(cluster.endpoint, timeout=60) as client:
            result = client.generate("x" * 200, max_tokens=4, disagg="always")
        assert len(result.token_ids) == 4
        assert (result.metrics.prefill_worker, result.metrics.decode_worker) == ("prefill-0", "decode-0")
        processes = list(cluster.processes.values())
    assert all(p.poll() is not None for p in processes)


@pytest.mark.skipif(
    bool({"kvplane.controlplane.main", "kvplane.dataplane.agent.main"} & set(missing_server_modules())),
    reason="needs controlplane.main and dataplane.agent.main",
)
def test_local_cluster_start_failure_shows_the_log_tail(tmp_path: Path) -> None:
    cluster = LocalCluster(num_prefill=0, num_decode=1, agent_args=("--no-such-flag",), log_dir=tmp_path,
                           startup_timeout=60)  # fmt: skip
    with pytest.raises(ClusterError, match=r"(?s)decode-0 exited with code 2 during startup.*--no-such-flag"):
        cluster.start()
    assert all(p.poll() is not None for p in cluster.processes.values())  # nothing left running


@needs_servers
def test_demo_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvplane.apps.demo"], capture_output=True, text=True, timeout=240, cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PREFILL" in result.stdout and "decode-0" in result.stdout
    assert "gibberish" in result.stdout
