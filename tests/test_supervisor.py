"""The supervisor of `kvplane up`: restart with doubling back-off, reset after a healthy run,
give up after too many failures in a row. Driven with a fake cluster and explicit times."""

from __future__ import annotations

import pytest

from kvplane.apps.supervisor import GaveUp, RestartPolicy, Supervisor

POLICY = RestartPolicy(initial_backoff_s=1.0, max_backoff_s=4.0, healthy_after_s=30.0, max_failures=3)


class FakeCluster:
    def __init__(self) -> None:
        self.started_at = {"a": 0.0, "b": 0.0}
        self.codes: dict[str, int] = {}
        self.respawned: list[tuple[str, float]] = []
        self.now = 0.0

    def exited(self) -> dict[str, int]:
        return dict(self.codes)

    def respawn(self, name: str) -> None:
        del self.codes[name]
        self.started_at[name] = self.now
        self.respawned.append((name, self.now))

    def log_tail(self, name: str, num_lines: int = 30) -> str:
        return f"(last lines of {name})"


def run(supervisor: Supervisor, cluster: FakeCluster, now: float) -> list[str]:
    cluster.now = now
    return supervisor.step(now)


def test_backoff_doubles_up_to_its_cap():
    assert [POLICY.backoff_s(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 4.0]
    assert POLICY.failures_after(2, ran_for_s=5.0) == 3
    assert POLICY.failures_after(2, ran_for_s=30.0) == 1


def test_a_crashed_child_is_restarted_after_its_backoff_and_the_others_keep_running():
    cluster = FakeCluster()
    supervisor = Supervisor(cluster, POLICY)
    cluster.codes["a"] = -9
    assert run(supervisor, cluster, 10.0) == ["a exited with code -9 after 10.0 s; restarting it in 1 s"]
    assert run(supervisor, cluster, 10.5) == []  # not due yet
    assert run(supervisor, cluster, 11.0) == ["a restarted (restart 1 in a row)"]
    assert cluster.respawned == [("a", 11.0)] and "b" not in cluster.codes
    # It dies again at once: the back-off doubles.
    cluster.codes["a"] = 1
    assert run(supervisor, cluster, 11.5) == ["a exited with code 1 after 0.5 s; restarting it in 2 s"]
    run(supervisor, cluster, 13.5)
    # A long healthy run resets the count.
    cluster.codes["a"] = 1
    assert run(supervisor, cluster, 60.0) == ["a exited with code 1 after 46.5 s; restarting it in 1 s"]
    assert supervisor.num_restarts == 2


def test_it_gives_up_on_a_child_that_keeps_failing():
    cluster = FakeCluster()
    supervisor = Supervisor(cluster, POLICY)
    now = 1.0
    for _ in range(POLICY.max_failures):
        cluster.codes["b"] = 2
        run(supervisor, cluster, now)
        now += 10.0
        run(supervisor, cluster, now)
    cluster.codes["b"] = 2
    with pytest.raises(
        GaveUp, match=r"b exited 4 times in a row \(exit codes \[2, 2, 2, 2\]\); giving up. Last lines of its log:\n\(last lines of b\)"
    ):
        run(supervisor, cluster, now + 1.0)


def test_policy_checks_its_numbers():
    with pytest.raises(ValueError, match="RestartPolicy needs"):
        RestartPolicy(initial_backoff_s=10.0, max_backoff_s=1.0)
