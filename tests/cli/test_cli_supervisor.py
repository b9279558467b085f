"""`kvplane up` supervises its processes: a SIGKILLed agent is restarted with back-off and rejoins
while the other keeps serving; a SIGKILLed control-plane replica (of two, mutual TLS) is restarted
with its certificate while clients fail over to the other; a child whose restarts keep failing
makes `kvplane up` give up. Real `kvplane up` processes, real signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvplane.apps.cluster import free_port
from kvplane.client import Client
from kvplane.errors import UnavailableError
from tests.cli.conftest import REPO_ROOT

pytestmark = pytest.mark.cluster


def _start_up(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str, list[str]]:
    """Runs `kvplane up --both 2 ARGS` until it is ready; returns it, its endpoint and a list
    that collects its stderr lines as they come."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    up = subprocess.Popen(
        [sys.executable, "-m", "kvplane", "up", "--port", str(port), "--prefill", "0", "--decode", "0", "--both", "2",
         "--log-dir", str(tmp_path), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(iter(up.stderr.readline, "")), daemon=True).start()
    first = up.stdout.readline()
    assert first.startswith("kvplane cluster ready at "), first + "".join(stderr)
    return up, first.removeprefix("kvplane cluster ready at ").strip(), stderr


def _child_pid(up: subprocess.Popen, *words: str) -> int:
    """The pid of the child of `up` whose argv holds every one of `words`."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
            ppid = int((cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == up.pid and all(w.encode() in argv for w in words):
            return int(cmdline.parent.name)
    raise AssertionError(f"no child {' '.join(words)} of kvplane up {up.pid}")


def _agent_pid(up: subprocess.Popen, worker_id: str) -> int:
    return _child_pid(up, "agent", worker_id)


def _wait_line(stderr: list[str], text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(stderr):
            if text in line:
                return line
        time.sleep(0.1)
    raise AssertionError(f"no stderr line with {text!r} within {timeout} s; got:\n{''.join(stderr)}")


def _stop(up: subprocess.Popen) -> int:
    if up.poll() is None:
        up.send_signal(signal.SIGINT)
    try:
        return up.wait(timeout=60)
    except subprocess.TimeoutExpired:
        up.kill()
        return up.wait()


def test_a_killed_agent_is_restarted_and_rejoins_while_the_other_serves(tmp_path):
    up, endpoint, stderr = _start_up(tmp_path)
    try:
        with Client(endpoint, timeout=60) as client:
            os.kill(_agent_pid(up, "both-0"), signal.SIGKILL)
            # Meanwhile the survivor serves.
            for seed in range(3):
                result = client.generate([seed + 1] * 20, max_tokens=4, disagg="never")
                assert len(result.token_ids) == 4
            assert "both-0 exited with code -9" in _wait_line(stderr, "both-0 exited", 10)
            _wait_line(stderr, "both-0 restarted", 20)
            deadline = time.monotonic() + 60
            while {w.worker_id for w in client.workers() if w.load_age_s < 1.0} != {"both-0", "both-1"}:
                assert time.monotonic() < deadline, f"both-0 did not rejoin; stderr:\n{''.join(stderr)}"
                time.sleep(0.2)
            assert up.poll() is None  # still supervising
    finally:
        assert _stop(up) == 0


def test_a_killed_replica_of_two_is_restarted_with_its_certificate_while_clients_fail_over(tmp_path, etcd_factory):
    etcd = etcd_factory()
    up, endpoints, stderr = _start_up(tmp_path, "--replicas", "2", "--store", f"etcd://{etcd.endpoint}")
    try:
        first, second = endpoints.split(",")
        # Credentials come from the directories `kvplane up` published for each replica.
        with Client(endpoints, timeout=60) as client:
            assert client.credentials.describe().startswith("mutual TLS"), client.credentials.describe()
            port = first.rpartition(":")[2]
            os.kill(_child_pid(up, "controlplane", port), signal.SIGKILL)
            for seed in range(3):  # the other replica serves meanwhile
                assert len(client.generate([seed + 1] * 20, max_tokens=4).token_ids) == 4
            _wait_line(stderr, "controlplane restarted", 20)
        # The restarted replica serves over mutual TLS again, with agents that know it.
        with Client(first, timeout=60) as client:
            deadline = time.monotonic() + 60
            while True:  # restarted means spawned: it listens once it has started up
                try:
                    if {w.worker_id for w in client.workers() if w.load_age_s < 1.0} == {"both-0", "both-1"}:
                        break
                except UnavailableError:
                    pass
                assert time.monotonic() < deadline, f"the restarted replica does not see both agents; stderr:\n{''.join(stderr)}"
                time.sleep(0.2)
            assert len(client.generate([7] * 20, max_tokens=4).token_ids) == 4
        with Client(second, timeout=60) as client:
            assert client.credentials.describe().startswith("mutual TLS"), client.credentials.describe()
            assert len(client.generate([8] * 20, max_tokens=4).token_ids) == 4
        assert up.poll() is None
    finally:
        assert _stop(up) == 0


def test_a_child_whose_restarts_keep_failing_makes_up_give_up(tmp_path):
    up, _, stderr = _start_up(tmp_path, "--max-restarts", "2")
    blocker = socket.socket()
    try:
        pid = _agent_pid(up, "both-1")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        port = int(argv[argv.index(b"--port") + 1])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while True:  # take its port, so that every restart fails to listen
            try:
                blocker.bind(("127.0.0.1", port))
                blocker.listen()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert up.wait(timeout=120) == 1
        time.sleep(0.5)
        message = "".join(stderr)
        assert "both-1 exited 3 times in a row" in message and "giving up" in message and "stopping the cluster" in message
    finally:
        blocker.close()
        _stop(up)
