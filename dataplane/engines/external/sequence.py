"""Gap detection on an engine's numbered KV-event batches (pure).

Rule: batches are numbered 0, 1, 2, ... by the engine's publisher. The subscriber applies them in
order; a batch past the next expected number means batches were lost (ZMQ PUB drops on a slow
subscriber, and drops everything sent before the subscription took hold); a batch below it on the
live stream means the publisher started counting again (the engine restarted, its cache is empty),
unless it is a batch a replay already applied (same number and timestamp: the live stream caught
up with the replay). Replayed batches below the next expected number are duplicates.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass

_RECENT = 4096  # applied batches remembered to tell a late live duplicate from a restart


class Verdict(enum.Enum):
    APPLY = "apply"  # the next batch in order
    GAP = "gap"  # batches [missing_from, seq) were lost: replay them, or resync
    DUPLICATE = "duplicate"  # already applied (a replay overlapping the live stream)
    RESTART = "restart"  # the publisher counts from 0 again: forget, then treat as a first batch


@dataclass(frozen=True, slots=True)
class Check:
    verdict: Verdict
    missing_from: int = 0


class Sequencer:
    def __init__(self) -> None:
        self.next_seq: int | None = None  # None until the first batch: nothing is known yet
        self._recent: OrderedDict[int, float] = OrderedDict()  # seq -> ts of applied batches

    def check_live(self, seq: int, ts: float | None = None) -> Check:
        if self.next_seq is None:
            return Check(Verdict.APPLY) if seq == 0 else Check(Verdict.GAP, 0)
        if seq == self.next_seq:
            return Check(Verdict.APPLY)
        if seq > self.next_seq:
            return Check(Verdict.GAP, self.next_seq)
        if ts is not None and self._recent.get(seq) == ts:
            return Check(Verdict.DUPLICATE)
        return Check(Verdict.RESTART)

    def check_replayed(self, seq: int) -> Check:
        expected = self.next_seq or 0
        if seq < expected:
            return Check(Verdict.DUPLICATE)
        if seq == expected:
            return Check(Verdict.APPLY)
        return Check(Verdict.GAP, expected)  # the publisher's replay buffer no longer has them

    def applied(self, seq: int, ts: float | None = None) -> None:
        self.next_seq = seq + 1
        if ts is not None:
            self._recent[seq] = ts
            while len(self._recent) > _RECENT:
                self._recent.popitem(last=False)

    def reset(self) -> None:
        self.next_seq = None
        self._recent.clear()
