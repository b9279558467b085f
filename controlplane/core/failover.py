"""What to do when a worker fails a request: try again elsewhere, move it, or end it.

    next_step(failure, num_tokens_sent, num_attempts, num_migrations, limits) -> Step

- A failure of the request itself (the worker refused it as invalid, or its engine failed on it)
  ends it: another worker would fail it the same way.
- A failure of the worker (it died, is draining or unhealthy, or stalled: no first or next token
  within the progress timeout) before any token reached the caller: route it again without that
  worker, up to `max_route_attempts` attempts in all.
- The same after tokens reached the caller: **migrate** it (as Dynamo does for decode workers):
  the next worker gets the prompt plus the tokens already sent (`resumed`) and the stream
  continues after them, with no gap and no repeat; greedy output equals an uninterrupted run.
  At most `max_migrations` times per request; then the caller gets UNAVAILABLE.
Plain Python: gRPC status codes arrive as their names.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from kvplane.controlplane.core.routing import RouteRequest


class Failure(enum.Enum):
    WORKER = "worker_failed"  # died, draining, unhealthy, unreachable
    STALLED = "worker_stalled"  # no first or next token within the progress timeout
    REQUEST = "request_failed"  # the worker refused or failed this request itself


class Step(enum.Enum):
    RETRY = "retry"  # nothing was sent yet: route again without the failed worker
    MIGRATE = "migrate"  # tokens were sent: resume on another worker after them
    FAIL = "fail"  # end the call with the failure's status


# Agent status codes that say the worker, not the request, failed: worth another worker.
WORKER_FAILURE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "ABORTED", "RESOURCE_EXHAUSTED"})


def classify(code_name: str) -> Failure:
    """The failure an agent's gRPC status code (by name) stands for."""
    return Failure.WORKER if code_name in WORKER_FAILURE_CODES else Failure.REQUEST


@dataclass(frozen=True, slots=True)
class FailoverLimits:
    max_route_attempts: int = 2  # attempts before the first token, the first included
    max_migrations: int = 2  # moves after tokens were sent

    def __post_init__(self) -> None:
        if self.max_route_attempts < 1 or self.max_migrations < 0:
            raise ValueError(f"max_route_attempts must be >= 1 and max_migrations >= 0, got {self}")


def next_step(failure: Failure, num_tokens_sent: int, num_attempts: int, num_migrations: int, limits: FailoverLimits) -> Step:
    """`num_attempts`: attempts made so far for this request (the failed one included)."""
    if failure is Failure.REQUEST:
        return Step.FAIL
    if num_tokens_sent == 0:
        return Step.RETRY if num_attempts < limits.max_route_attempts else Step.FAIL
    return Step.MIGRATE if num_migrations < limits.max_migrations else Step.FAIL


def resumed(request: RouteRequest, sent_token_ids: Sequence[int]) -> RouteRequest:
    """The request a migration routes: the prompt plus what was sent, the rest of max_tokens."""
    if len(sent_token_ids) >= request.max_tokens:
        raise ValueError(f"{len(sent_token_ids)} tokens sent of max_tokens {request.max_tokens}: nothing left to resume")
    return dataclasses.replace(
        request,
        prompt_token_ids=(*request.prompt_token_ids, *sent_token_ids),
        max_tokens=request.max_tokens - len(sent_token_ids),
    )
