"""LocalCluster.stop leaves nothing running: a child's own children go with it, even when the
child itself was killed first (an engine server's workers outlive a killed server); and a child
that crashed has what it left killed as soon as its exit is seen (`exited()`, which `kvplane up`'s
supervisor polls before it starts the child again), while its pid still names only its group."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from kvplane.apps.cluster import LocalCluster

from .helpers import wait_for

pytestmark = pytest.mark.cluster  # starts processes

# A stand-in for an engine server: starts a worker process of its own, then waits.
_SERVER = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(worker.pid))
time.sleep(600)
"""


def _gone_within(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _alive(pid: int) -> bool:
    """Running (a zombie that init has not reaped yet counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("killed_first", [False, True])
def test_stop_leaves_no_grandchild_running(tmp_path, killed_first):
    cluster = LocalCluster(num_prefill=0, num_decode=0, num_both=1, log_dir=tmp_path)
    cluster.log_dir = tmp_path  # the child below is all this cluster runs: no start()
    pid_file = tmp_path / "worker.pid"
    cluster._spawn("engine-x", [sys.executable, "-c", _SERVER, str(pid_file)], env=dict(os.environ))
    try:
        worker = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30, what="the server's worker"))
        assert _alive(worker)
        if killed_first:
            cluster.kill("engine-x", signal.SIGKILL)
            cluster.processes["engine-x"].wait(timeout=10)
            assert _alive(worker)  # orphaned, still running: what stop() must clean up
    finally:
        cluster.stop()
    assert _gone_within(worker, 10)


def test_stop_kills_the_group_before_the_child_is_reaped(tmp_path, monkeypatch):
    """Once a child is reaped its pid may name another process's group: the kill must come while
    the child is a zombie (its /proc entry still there, state Z)."""
    cluster = LocalCluster(num_prefill=0, num_decode=0, num_both=1, log_dir=tmp_path)
    cluster.log_dir = tmp_path
    pid_file = tmp_path / "worker.pid"
    cluster._spawn("engine-x", [sys.executable, "-c", _SERVER, str(pid_file)], env=dict(os.environ))
    states: list[str] = []
    real_killpg = os.killpg

    def killpg(pgid: int, sig: int) -> None:
        try:
            states.append(Path(f"/proc/{pgid}/stat").read_text().split(") ")[1][0])
        except FileNotFoundError:
            states.append("reaped")
        real_killpg(pgid, sig)

    try:
        worker = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30, what="the server's worker"))
        monkeypatch.setattr("kvplane.apps.cluster.os.killpg", killpg)
    finally:
        cluster.stop()
    assert states == ["Z"]  # one kill, while the child was a zombie
    assert _gone_within(worker, 10)


def test_a_crashed_childs_leftovers_are_killed_when_its_exit_is_seen(tmp_path):
    cluster = LocalCluster(num_prefill=0, num_decode=0, num_both=1, log_dir=tmp_path)
    cluster.log_dir = tmp_path
    pid_file = tmp_path / "worker.pid"
    cluster._spawn("engine-x", [sys.executable, "-c", _SERVER, str(pid_file)], env=dict(os.environ))
    try:
        first = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30, what="the first server's worker"))
        pid_file.unlink()
        cluster.kill("engine-x", signal.SIGKILL)  # a crash: its worker is orphaned, still running
        assert _alive(first)
        # The supervisor's loop: it notices the exit (its orphan is killed then), waits, restarts.
        assert wait_for(lambda: cluster.exited().get("engine-x"), timeout=10, what="the crash to be seen") == -signal.SIGKILL
        assert _gone_within(first, 10)
        cluster.respawn("engine-x")
        second = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30, what="the new server's worker"))
        assert _alive(second) and cluster.processes["engine-x"].poll() is None  # the new one is not touched
    finally:
        cluster.stop()
    assert _gone_within(second, 10)
