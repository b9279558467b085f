"""`kvplane bench controlplane --pin` (kvplane/apps/bench/cores.py): a core per replica, the rest for
everything else, every thread of a process pinned."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kvplane.apps.bench.cores import pin, split_cores
from tests.cli.conftest import run_kvplane


def test_each_replica_gets_a_core_of_its_own_and_the_rest_share_the_others():
    assert split_cores(1, {0, 1}) == ([{0}], {1})
    assert split_cores(2, {3, 5, 6, 7}) == ([{3}, {5}], {6, 7})
    with pytest.raises(ValueError, match=r"2 replica\(s\) need 3 cores and this process may use 2; run fewer replicas or leave out --pin"):
        split_cores(2, {0, 1})


@pytest.mark.cluster
def test_every_thread_of_a_process_and_those_it_starts_later_are_pinned():
    core = min(os.sched_getaffinity(0))
    code = (
        "import threading, time, sys\n"
        "threads = [threading.Thread(target=time.sleep, args=(30,), daemon=True) for _ in range(3)]\n"
        "[t.start() for t in threads]\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"  # pinned meanwhile
        "later = threading.Thread(target=time.sleep, args=(30,), daemon=True); later.start()\n"
        "print(later.native_id, flush=True)\n"
        "sys.stdin.readline()\n"
    )  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        tasks = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tasks) >= 4
        pin(child.pid, {core})
        assert all(os.sched_getaffinity(t) == {core} for t in tasks)
        child.stdin.write("\n")
        child.stdin.flush()
        later = int(child.stdout.readline())
        assert os.sched_getaffinity(later) == {core}  # inherited from the thread that started it
    finally:
        child.kill()
        child.wait()


@pytest.mark.cluster
def test_pin_with_more_replicas_than_cores_allow_says_so_before_starting_anything():
    started = time.monotonic()
    cores = len(os.sched_getaffinity(0))
    done = run_kvplane("bench", "controlplane", "--pin", "--replicas", str(cores), "--idle-only", timeout=60)
    assert done.returncode == 2
    assert f"{cores} replica(s) need {cores + 1} cores and this process may use {cores}" in done.stderr
    assert time.monotonic() - started < 30  # no etcd, agent or replica was started
