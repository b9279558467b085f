"""Worker health: a stalled worker is out of routing for a while; a silent one (no load reports)
is out only while the store is known to work, so a store outage never empties the cluster.
Fleet defaults (conftest). Times are seconds on one monotonic clock."""

from __future__ import annotations

import pytest

from kvplane.controlplane.core.health import HealthConfig, WorkerHealth
from kvplane.controlplane.core.views import ClusterView
from kvplane.types import WorkerId

CONFIG = HealthConfig(silent_after_s=3.0, stalled_for_s=30.0)


def test_a_stalled_worker_is_out_for_stalled_for_s_then_back(index, worker_view):
    health = WorkerHealth(CONFIG)
    cluster = ClusterView((worker_view("a", reported_at=99.0), worker_view("b", reported_at=99.0)), index, store_ok_at=100.0)
    health.stalled(WorkerId("a"), now=100.0)
    assert dict(health.excluded(cluster, now=100.0)) == {"a": "stalled a request 0.0 s ago"}
    assert list(health.excluded(cluster, now=129.9)) == ["a"]
    fresh = ClusterView((worker_view("a", reported_at=130.0), worker_view("b", reported_at=130.0)), index, store_ok_at=130.0)
    assert health.excluded(fresh, now=130.0) == {}
    health.stalled(WorkerId("b"), now=131.0)
    health.forget(WorkerId("b"))
    assert health.excluded(fresh, now=131.0) == {}


def test_a_worker_whose_reports_stop_while_the_store_answers_is_out(index, worker_view):
    health = WorkerHealth(CONFIG)
    cluster = ClusterView((worker_view("stopped", reported_at=10.0), worker_view("live", reported_at=19.8)), index, store_ok_at=19.9)
    assert dict(health.excluded(cluster, now=20.0)) == {"stopped": "no load report for 10.0 s"}
    # Within silent_after_s of its last report it is still in.
    assert health.excluded(cluster, now=12.9) == {}


def test_a_store_outage_silences_everyone_and_excludes_no_one(index, worker_view):
    """Every report stopped at 10 s because the store did: routing goes on with the last known state."""
    health = WorkerHealth(CONFIG)
    cluster = ClusterView((worker_view("a", reported_at=10.0), worker_view("b", reported_at=10.1)), index, store_ok_at=10.2)
    assert health.excluded(cluster, now=40.0) == {}
    # Unknown store health (a view built by hand) or report time: no verdict either.
    assert health.excluded(ClusterView(cluster.workers, index), now=40.0) == {}
    assert health.excluded(ClusterView((worker_view("c"),), index, store_ok_at=40.0), now=40.0) == {}


@pytest.mark.parametrize("field", ["silent_after_s", "stalled_for_s"])
def test_config_refuses_non_positive_times(field):
    with pytest.raises(ValueError, match=f"HealthConfig.{field} must be > 0"):
        HealthConfig(**{field: 0.0})


def test_a_failed_worker_is_out_until_it_reports_again(index, worker_view):
    health = WorkerHealth(CONFIG)
    health.failed(WorkerId("a"), now=50.0)
    before = ClusterView((worker_view("a", reported_at=49.9), worker_view("b", reported_at=50.1)), index, store_ok_at=50.1)
    assert dict(health.excluded(before, now=51.0)) == {"a": "failed a request 1.0 s ago and has not reported since"}
    # A report after the failure (a restarted agent) brings it back at once.
    after = ClusterView((worker_view("a", reported_at=51.2), worker_view("b", reported_at=51.2)), index, store_ok_at=51.2)
    assert health.excluded(after, now=51.3) == {}


def test_stalls_and_failures_that_are_over_are_forgotten(index, worker_view):
    """Every request walks the workers that stalled or failed: without forgetting those that are
    over, a long-lived fleet would walk nearly every worker per request (the internal maps read
    here are that walk)."""
    health = WorkerHealth(CONFIG)
    names = [f"w{i}" for i in range(50)]
    for i, name in enumerate(names):
        (health.stalled if i % 2 else health.failed)(WorkerId(name), now=100.0)
    during = ClusterView(tuple(worker_view(n, reported_at=99.0) for n in names), index, store_ok_at=100.0)
    assert len(health.excluded(during, now=101.0)) == 50
    # Every failed worker reported since; the stalls last until 130.
    reported = ClusterView(tuple(worker_view(n, reported_at=120.0) for n in names), index, store_ok_at=120.0)
    assert len(health.excluded(reported, now=120.0)) == 25 and not health._failed_at
    later = ClusterView(tuple(worker_view(n, reported_at=130.0) for n in names), index, store_ok_at=130.0)
    assert health.excluded(later, now=130.0) == {} and not health._stalled_until
    health.stalled(WorkerId("w0"), now=131.0)  # a new stall counts again
    assert list(health.excluded(later, now=131.0)) == ["w0"]
