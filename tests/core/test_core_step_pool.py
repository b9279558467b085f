"""StepModelPool: workers of one kind are priced with one step-time model, each coefficient's
median over the kind's published models, refreshed when enough of them changed."""

from __future__ import annotations

import pytest

from kvplane.controlplane.core.step_pool import StepModelPool, pooled_model
from kvplane.latency import StepTimeModel
from kvplane.types import WorkerId


def model(c1: float, c0: float = 0.01, samples: int = 100) -> StepTimeModel:
    return StepTimeModel((c0, c1, 0.0, 1e-4, 1e-7), samples, 0.05)


def W(name: str) -> WorkerId:
    return WorkerId(name)


def test_identical_workers_are_priced_alike_whatever_their_own_fits_say():
    pool = StepModelPool()
    for name, c1 in (("a", 2e-5), ("b", 4e-5), ("c", 3e-5)):
        pool.update(W(name), "llama/h100", model(c1))
    priced = {pool.model_of(W(n)) for n in "abc"}
    assert len(priced) == 1
    assert priced.pop().coefficients[1] == pytest.approx(3e-5)  # the median, not the optimistic 2e-5


def test_a_worker_publishing_a_flattering_model_does_not_get_it():
    pool = StepModelPool()
    for name in "abc":
        pool.update(W(name), "k", model(3e-5))
    pool.update(W("liar"), "k", model(1e-9, c0=0.0))
    assert pool.model_of(W("liar")).coefficients[1] == pytest.approx(3e-5)


def test_kinds_are_priced_apart_and_a_worker_without_a_model_gets_its_kinds():
    pool = StepModelPool()
    pool.update(W("fast"), "h100", model(1e-5))
    pool.update(W("slow"), "a10", model(8e-5))
    pool.update(W("new"), "h100", None)
    assert pool.model_of(W("fast")).coefficients[1] == 1e-5
    assert pool.model_of(W("slow")).coefficients[1] == 8e-5
    assert pool.model_of(W("new")) == pool.model_of(W("fast"))
    pool.update(W("alone"), "mi300", None)
    assert pool.model_of(W("alone")) is None  # nobody of its kind has a model: none (the caller's fallback)


def test_the_pooled_model_is_refreshed_after_a_quarter_of_its_members_changed_and_names_who_changed():
    pool = StepModelPool(refresh_fraction=0.25)
    names = [f"w{i}" for i in range(8)]
    for name in names:
        pool.update(W(name), "k", model(3e-5))
    before = pool.model_of(W("w0"))
    assert pool.update(W("w0"), "k", model(9e-5)) == set()  # 1 of 8: not yet
    assert pool.model_of(W("w0")) is before
    assert pool.update(W("w1"), "k", model(9e-5)) == set()  # median still 3e-5: nothing changed
    for name in names[2:5]:
        pool.update(W(name), "k", model(9e-5))
    changed = pool.update(W("w5"), "k", model(9e-5))  # now 6 of 8 publish 9e-5
    assert pool.model_of(W("w0")).coefficients[1] == pytest.approx(9e-5)
    assert changed == set(names) - {"w5"}
    assert pool.update(W("w5"), "k", model(9e-5)) == set()  # the same model again: nothing new
    for name in names:  # every member refits within 1 %: the median moves too little to hand out
        pool.update(W(name), "k", model(9.05e-5))
    assert pool.model_of(W("w0")).coefficients[1] == pytest.approx(9e-5)


def test_a_departure_refreshes_the_pool_and_a_kind_change_moves_the_worker():
    pool = StepModelPool()
    pool.update(W("a"), "k", model(1e-5))
    pool.update(W("b"), "k", model(5e-5))
    assert pool.model_of(W("a")).coefficients[1] == pytest.approx(3e-5)
    assert pool.remove(W("b")) == {"a"}
    assert pool.model_of(W("a")).coefficients[1] == 1e-5
    assert pool.model_of(W("b")) is None
    pool.update(W("a"), "other", model(7e-5))
    assert pool.model_of(W("a")).coefficients[1] == 7e-5


def test_pooled_model_keeps_its_evidence():
    pooled = pooled_model([model(1e-5, samples=10), model(2e-5, samples=20), model(9e-5, samples=30)])
    assert pooled.num_samples == 60 and pooled.coefficients[1] == 2e-5
    assert pooled_model([]) is None
    with pytest.raises(ValueError):
        StepModelPool(refresh_fraction=0)
