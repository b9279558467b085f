"""`kvplane sim --decisions FILE`: every decision of every run as one JSON line, written when its
request ends: what arrived, every candidate the policy priced (its cost and, for kvplane's
rule, the predicted seconds it is made of), where the request went and why, admission's verdict
and prediction, and what the simulation then measured. The same explanation `kvplane route
--explain` gives for one live request, for each of a run's, beside its outcome: where the
model's predictions and the runs part, request by request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO, Any

from kvplane.controlplane.core.admission_base import Reject
from kvplane.controlplane.core.planner import Plan, Routed
from kvplane.controlplane.core.seconds import SecondsBreakdown

Sink = Callable[[dict[str, Any]], None]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _candidate(c) -> dict[str, Any]:
    entry = {"worker": c.worker_id, "cost": c.cost, "cached_tokens": c.cached_tokens, "prefill_tokens": c.prefill_tokens, "note": c.note}
    if isinstance(c.detail, SecondsBreakdown):  # kvplane's rule: the predicted seconds themselves
        d = c.detail
        entry |= {
            "placement": d.placement, "ttft_ms": _ms(d.ttft_s), "queue_ms": _ms(d.queue_s), "move_ms": _ms(d.move_s),
            "prefill_ms": _ms(d.prefill_s), "transfer_ms": _ms(d.transfer_s), "tpot_ms": _ms(d.tpot_s), "meets_objectives": d.meets,
            "cost_ms": _ms(d.cost_s),  # what its prefill costs the others (seconds.Priced.work)
        }  # fmt: skip
    return entry


def decided(index: int, arrival_s: float, now: float, routed: Routed, verdict: Plan | Reject) -> dict[str, Any]:
    """The decision on request `index`, made at virtual time `now` (its outcome comes at the end)."""
    d = routed.decision
    entry: dict[str, Any] = {
        "request": index, "arrival_s": round(arrival_s, 6), "decided_s": round(now, 6), "priority": routed.request.priority,
        "prompt_tokens": d.prompt_tokens, "max_tokens": routed.request.max_tokens,
        "router": {
            "decode_worker": d.decode_worker, "prefill_worker": d.prefill_worker, "fetch_from": d.fetch_from,
            "fetch_tokens": d.fetch_tokens, "cached_tokens": d.cached_tokens, "reason": d.reason,
        },
        "candidates": [_candidate(c) for c in d.candidates],
    }  # fmt: skip
    if isinstance(verdict, Reject):
        entry["admission"] = {"admitted": False, "reason": verdict.reason, "retry_after_s": verdict.retry_after_s}
        return entry
    p = verdict.prediction
    entry["admission"] = {
        "admitted": True, "decode_worker": verdict.decode_worker, "prefill_worker": verdict.prefill_worker,
        "fetch_from": verdict.fetch_from, "follows_router": verdict.follows_router,
    }  # fmt: skip
    if p is not None:
        entry["predicted"] = {
            "ttft_ms": _ms(p.ttft_s), "tpot_ms": _ms(p.tpot_s), "queue_ms": _ms(p.queue_s), "prefill_ms": _ms(p.prefill_s),
            "transfer_ms": _ms(p.transfer_s), "fetch_ms": _ms(p.fetch_s), "ttft_offset_ms": _ms(p.ttft_offset_s),
            "tpot_offset_ms": _ms(p.tpot_offset_s), "tpot_spread_ms": _ms(p.tpot_spread_s),
            "tpot_high_ms": round(p.tpot_high_ms, 3), "ttft_spread_ms": _ms(p.ttft_spread_s), "room_wait_ms": _ms(p.room_wait_s),
        }  # fmt: skip
    return entry


def ended(entry: dict[str, Any], record) -> dict[str, Any]:
    """`entry` with what the simulation measured for its request (a simulator.Record)."""
    outcome = "rejected" if record.rejected else "failed" if record.failed else "finished" if record.finished_s is not None else "not ended"
    entry["outcome"] = outcome
    if outcome in ("finished", "failed"):
        entry["measured"] = {
            "ttft_ms": _ms(record.ttft_s), "tpot_ms": _ms(record.tpot_s), "cached_tokens": record.cached_tokens,
            "output_tokens": record.num_tokens, "decode_worker": record.decode_worker, "prefill_worker": record.prefill_worker,
            "kv_transfer_ms": _ms(record.kv_transfer_s), "kv_transfer_bytes": record.kv_transfer_bytes,
            "kv_wait_ms": _ms(record.kv_wait_s),
        }  # fmt: skip
    return entry


class DecisionLog:
    """The JSON-lines file of a command's runs; `sink(...)` labels one run's lines."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self.num_lines = 0

    def sink(self, **run: str) -> Sink:
        def write(entry: dict[str, Any]) -> None:
            self._out.write(json.dumps({"run": run, **entry}) + "\n")
            self.num_lines += 1

        return write
