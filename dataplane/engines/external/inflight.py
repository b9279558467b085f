"""The requests this agent has in flight on its engine, for the load it reports.

An external engine reports how many requests run and wait, but not the per-request numbers the
planner's predictor wants: tokens still to prefill, and tokens each running request may still
generate. The agent knows them for the requests it sent (all of them, for a sidecar that is the
engine's only client): a request's prompt counts as queued prefill work until its first output,
then its remaining tokens (max_tokens - generated) ride in the decode batch until it ends.

It also corrects the engine's polled load, which lags by up to a poll interval: a sample taken
before a request ended still counts the request and its KV blocks, and a worker that just served
a prefix would look busier than it is, right when the router should send the prefix's next
request there. So every start and end is timed, and the blocks of requests that ended after a
sample was taken are subtracted from it (dataplane/engines/external/engine.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

_RELEASE_MEMORY_S = 10.0  # ended requests remembered for correcting older samples


@dataclass(slots=True)
class _Request:
    num_prompt_tokens: int
    max_tokens: int
    num_generated: int = 0
    prefilled: bool = False


class InFlight:
    def __init__(self, block_size: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.block_size = block_size  # set by the adapter once the engine told it
        self._clock = clock
        self._requests: dict[str, _Request] = {}
        self._released: deque[tuple[float, int]] = deque()  # (when, KV blocks) of ended requests
        self.changed_at = 0.0  # when a request last started or ended

    def started(self, request_id: str, num_prompt_tokens: int, max_tokens: int) -> None:
        self._requests[request_id] = _Request(num_prompt_tokens, max_tokens)
        self.changed_at = self._clock()

    def progressed(self, request_id: str, num_new_tokens: int) -> None:
        request = self._requests.get(request_id)
        if request is not None:
            request.prefilled = True
            request.num_generated += num_new_tokens

    def ended(self, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        now = self.changed_at = self._clock()
        num_blocks = -(-(request.num_prompt_tokens + request.num_generated) // self.block_size)
        self._released.append((now, num_blocks))
        while self._released and now - self._released[0][0] > _RELEASE_MEMORY_S:
            self._released.popleft()

    def blocks_released_since(self, t: float) -> int:
        """KV blocks of requests that ended after time `t` (a load sample taken at `t` still counts them)."""
        return sum(n for when, n in self._released if when > t)

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    @property
    def num_waiting(self) -> int:
        return sum(1 for r in self._requests.values() if not r.prefilled)

    @property
    def num_running(self) -> int:
        return sum(1 for r in self._requests.values() if r.prefilled)

    @property
    def num_queued_prefill_tokens(self) -> int:
        return sum(r.num_prompt_tokens for r in self._requests.values() if not r.prefilled)

    @property
    def running_remaining_tokens(self) -> tuple[int, ...]:
        return tuple(max(r.max_tokens - r.num_generated, 0) for r in self._requests.values() if r.prefilled)

    @property
    def running_context_tokens(self) -> int:
        return sum(r.num_prompt_tokens + r.num_generated for r in self._requests.values() if r.prefilled)
