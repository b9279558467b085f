"""Pinning a benchmark's processes to cores (`kvplane bench controlplane --pin`): each control-plane
replica alone on a core of its own, everything else (etcd, NATS, agents, load generators, the
bench) on the cores left, so that replicas neither share a core nor wait behind the fleet that
loads them, and R replicas can be compared with one (issue 27: two on separate cores against one).
Linux only (sched_setaffinity); a process's threads are pinned one by one, as the call pins one
thread and threads started later inherit their creator's set."""

from __future__ import annotations

import os
from pathlib import Path


def split_cores(num_replicas: int, available: set[int]) -> tuple[list[set[int]], set[int]]:
    """One core of `available` (the bench's own, read before it pins itself) per replica and the
    rest for everything else; raises ValueError (its message says what to do) when there are not
    enough cores for that."""
    cores = sorted(available)
    if len(cores) < num_replicas + 1:
        raise ValueError(
            f"--pin needs a core per replica and at least one more for the rest: {num_replicas} replica(s) need "
            f"{num_replicas + 1} cores and this process may use {len(cores)}; run fewer replicas or leave out --pin"
        )
    return [{core} for core in cores[:num_replicas]], set(cores[num_replicas:])


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of process `pid` (and those it starts later) onto `cores`."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cores)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
