"""Lookaside mode's bookkeeping: requests this replica placed for their callers to run.

A lookaside Route admits a request and charges its workers as Generate would, then hands the
caller a Placement (the agent request, with a single-use ticket for the caller's tenant) instead
of relaying the agent's stream. The caller reports the first token, the end, a cancel or a
failure (Kvplane.Report); until then a `Placed` entry here holds what those reports need: the
dispatch to release, the attempt and migration counts, the workers the request failed on.

Nothing stays charged when a caller goes silent: an entry expires when a relayed request would
have been declared stalled, i.e. no first token within the ticket's lifetime plus
`first_token_timeout_s`, then no end within `token_timeout_s` per token still to come. The
service releases an expired entry's charge and counts it (`expired`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvplane.controlplane.core.planner import Plan
from kvplane.controlplane.observe import RequestObservation
from kvplane.security.limits import clip
from kvplane.v1 import client_pb2


def new_placement_id() -> str:
    return secrets.token_hex(16)  # unguessable: a placement id is all a Report names


@dataclass(slots=True)
class Placed:
    """One placed request, across its attempts (a failure report may place it again)."""

    placement_id: str
    owner: str  # the identity that placed it (Identity.key); only it may report
    validated: Any  # client_service.Validated: the request as admitted
    request: client_pb2.GenerateRequest  # the caller's (its sampling parameters)
    started: float  # when the Route call arrived
    observation: RequestObservation
    sent: list[int]  # tokens the caller had when this attempt was placed
    resumed_by_caller: bool  # the caller resumed it (its earlier tokens came from elsewhere)
    expires_at: float = 0.0
    plan: Plan | None = None  # the current attempt's
    dispatch_id: int = -1
    queued_s: float = 0.0
    num_attempts: int = 0
    num_migrations: int = 0
    first_token: bool = False
    exclude: set[str] = field(default_factory=set)


class LookasideBook:
    """The placed requests of one replica, by placement id, and their expiry."""

    def __init__(self, clock: Callable[[], float], sweep_every_s: float = 1.0) -> None:
        self._clock = clock
        self._entries: dict[str, Placed] = {}
        self._sweep_every_s = sweep_every_s
        self._next_sweep = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, placed: Placed) -> None:
        self._entries[placed.placement_id] = placed

    def take(self, placement_id: str, owner: str) -> Placed | None:
        """The entry, if `owner` placed it (another caller learns nothing, not even that it exists)."""
        placed = self._entries.get(placement_id)
        return placed if placed is not None and placed.owner == owner else None

    def pop(self, placement_id: str) -> None:
        self._entries.pop(placement_id, None)

    def expired(self) -> list[Placed]:
        """Entries past their expiry, removed; scans at most once per sweep_every_s."""
        now = self._clock()
        if now < self._next_sweep:
            return []
        self._next_sweep = now + self._sweep_every_s
        gone = [p for p in self._entries.values() if p.expires_at <= now]
        for p in gone:
            del self._entries[p.placement_id]
        return gone


def unknown_placement(placement_id: str) -> str:
    return (
        f"no placement {clip(placement_id)} of yours on this replica: it ended, expired, or another replica made it; "
        "route the request again (with resume_token_ids for the tokens you have)"
    )
