"""Failover decisions: retry before the first token, migrate after it, fail the request's own
errors at once, and stop at the limits; a resumed request continues after what was sent."""

from __future__ import annotations

import pytest

from kvplane.controlplane.core.failover import FailoverLimits, Failure, Step, classify, next_step, resumed
from kvplane.types import DisaggMode
from tests.core.conftest import make_request

LIMITS = FailoverLimits(max_route_attempts=2, max_migrations=2)


@pytest.mark.parametrize(
    ("code", "failure"),
    [
        ("UNAVAILABLE", Failure.WORKER),
        ("DEADLINE_EXCEEDED", Failure.WORKER),
        ("CANCELLED", Failure.WORKER),
        ("UNKNOWN", Failure.WORKER),
        ("INTERNAL", Failure.REQUEST),
        ("INVALID_ARGUMENT", Failure.REQUEST),
        ("FAILED_PRECONDITION", Failure.REQUEST),
        ("PERMISSION_DENIED", Failure.REQUEST),
    ],
)
def test_classify_by_status_code(code, failure):
    assert classify(code) is failure


@pytest.mark.parametrize(
    ("failure", "num_sent", "num_attempts", "num_migrations", "step"),
    [
        (Failure.WORKER, 0, 1, 0, Step.RETRY),  # nothing sent: route again without it
        (Failure.STALLED, 0, 1, 0, Step.RETRY),
        (Failure.WORKER, 0, 2, 0, Step.FAIL),  # the second attempt was the last
        (Failure.WORKER, 5, 1, 0, Step.MIGRATE),  # tokens sent: move it
        (Failure.STALLED, 5, 3, 1, Step.MIGRATE),  # attempts do not limit migrations
        (Failure.WORKER, 5, 3, 2, Step.FAIL),  # moved twice already
        (Failure.REQUEST, 0, 1, 0, Step.FAIL),  # the request itself failed: nowhere helps
        (Failure.REQUEST, 5, 1, 0, Step.FAIL),
    ],
)
def test_next_step(failure, num_sent, num_attempts, num_migrations, step):
    assert next_step(failure, num_sent, num_attempts, num_migrations, LIMITS) is step


def test_no_migrations_allowed_fails_after_tokens():
    assert next_step(Failure.WORKER, 1, 1, 0, FailoverLimits(max_migrations=0)) is Step.FAIL


def test_resumed_request_continues_after_the_sent_tokens():
    request = make_request([1, 2, 3], max_tokens=10, disagg=DisaggMode.AUTO, cache_salt="t")
    again = resumed(request, [7, 8, 9])
    assert (list(again.prompt_token_ids), again.max_tokens, again.disagg, again.cache_salt) == ([1, 2, 3, 7, 8, 9], 7, DisaggMode.AUTO, "t")
    with pytest.raises(ValueError, match="nothing left to resume"):
        resumed(request, list(range(10)))


def test_limits_are_checked():
    with pytest.raises(ValueError, match="max_route_attempts must be >= 1"):
        FailoverLimits(max_route_attempts=0)
