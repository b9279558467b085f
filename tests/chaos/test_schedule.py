"""The chaos schedule: reproducible from its seed, every fault kind early, targets from the cluster."""

from __future__ import annotations

import pytest

from tests.chaos.schedule import FAULT_KINDS, make_schedule

TARGETS = {
    "agent": ["decode-0", "decode-1"],
    "replica": ["controlplane"],
    "etcd": ["m0", "m1", "m2"],
    "prefill": ["prefill-0"],
    "bus": ["nats"],
}


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    assert make_schedule(7, 12, TARGETS) == make_schedule(7, 12, TARGETS)
    assert make_schedule(7, 12, TARGETS) != make_schedule(8, 12, TARGETS)


def test_every_kind_comes_first_then_at_random_with_fitting_targets():
    faults = make_schedule(3, 20, TARGETS)
    assert {f.kind for f in faults[: len(FAULT_KINDS)]} == set(FAULT_KINDS)
    for f in faults:
        kind = FAULT_KINDS[f.kind]
        assert (f.target in TARGETS[kind]) if kind else f.target == ""
        assert 2.0 <= f.duration_s <= 5.0
    assert [f.step for f in faults] == list(range(20))


def test_kinds_without_targets_are_left_out_and_steps_are_checked():
    faults = make_schedule(1, 10, {"agent": ["a"]})
    assert {f.kind for f in faults} <= {"kill_agent", "stop_agent", "drop_kv_batch", "client_cancel"}
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        make_schedule(1, 0, TARGETS)
