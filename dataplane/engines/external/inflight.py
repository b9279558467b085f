"""The requests this agent has in flight on its engine, for the load it reports.

An external engine reports how many requests run and wait, but not the per-request numbers the
planner's predictor wants: tokens still to prefill, and tokens each running request may still
generate. The agent knows them for the requests it sent (all of them, for a sidecar that is the
engine's only client): a request's prompt counts as queued prefill work until its first output,
then its remaining tokens (max_tokens - generated) ride in the decode batch until it ends.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Request:
    num_prompt_tokens: int
    max_tokens: int
    num_generated: int = 0
    prefilled: bool = False


class InFlight:
    def __init__(self) -> None:
        self._requests: dict[str, _Request] = {}

    def started(self, request_id: str, num_prompt_tokens: int, max_tokens: int) -> None:
        self._requests[request_id] = _Request(num_prompt_tokens, max_tokens)

    def progressed(self, request_id: str, num_new_tokens: int) -> None:
        request = self._requests.get(request_id)
        if request is not None:
            request.prefilled = True
            request.num_generated += num_new_tokens

    def ended(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

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
