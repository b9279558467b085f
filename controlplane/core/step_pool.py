"""One step-time model for the workers that run the same steps.

Each agent fits its own step-time model (kvplane.latency) from the steps it happens to run, so
two identical workers can publish models that disagree by 2x on a shape one of them has not
seen yet (measured: 81 vs 162 ms for the same 4,096-token prefill on two simulated agents of one
profile). Priced with their own models, identical workers then look different and a request goes
to the one whose fit happens to be optimistic. Workers of one *kind* (served model, KV block
layout, prefill chunk, hardware label) run the same kernels on the same hardware: they are
priced with one model, each coefficient's median over the kind's published models. The median
also keeps a worker that publishes a flattering model from pulling traffic with it (issue 28).
llm-d's latency predictor and Dynamo's planner likewise model a pool, not each pod.

What is not shared stays per worker: its load, its cache, and what the planner measures there
(core/trust.py discounts a worker whose measured TTFT runs far above the prediction).

The pooled model is recomputed when the kind's membership changes or when at least
`refresh_fraction` of its members have published a new model since the last one: a fleet's
models drift slowly, and every refresh hands every member a new view (a new row for the
routing columns), which at a thousand workers should not happen on every report; a new median
within 2 % of the last in every coefficient is not handed out at all.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable
from dataclasses import dataclass, field

from kvplane.latency import NUM_COEFFICIENTS, StepTimeModel
from kvplane.types import WorkerId

Kind = Hashable  # what makes two workers run the same steps (cluster_state.py builds it)
SAME_WITHIN = 0.02  # a pooled model whose coefficients all moved less than this (relative) is kept


@dataclass(slots=True)
class _Group:
    own: dict[WorkerId, StepTimeModel | None] = field(default_factory=dict)
    pooled: StepTimeModel | None = None
    num_new: int = 0  # members that published a new model since `pooled` was computed
    num_models: int = 0  # members that publish one (counted, not summed on every report)


class StepModelPool:
    """Each worker's own model in, the model it is priced with out (`model_of`)."""

    __slots__ = ("refresh_fraction", "_groups", "_kind_of")

    def __init__(self, refresh_fraction: float = 0.25) -> None:
        if not 0 < refresh_fraction <= 1:
            raise ValueError(f"refresh_fraction must be in (0, 1], got {refresh_fraction}")
        self.refresh_fraction = refresh_fraction
        self._groups: dict[Kind, _Group] = {}
        self._kind_of: dict[WorkerId, Kind] = {}

    def update(self, worker_id: WorkerId, kind: Kind, model: StepTimeModel | None) -> set[WorkerId]:
        """The worker is of `kind` and publishes `model` (None: none yet). Returns the workers
        whose priced model changed, besides `worker_id` itself."""
        changed: set[WorkerId] = set()
        old_kind = self._kind_of.get(worker_id)
        if old_kind is not None and old_kind != kind:
            changed |= self.remove(worker_id)
        group = self._groups.setdefault(kind, _Group())
        before = group.own.get(worker_id)
        if worker_id in group.own and before == model:
            return changed
        group.own[worker_id] = model
        self._kind_of[worker_id] = kind
        group.num_models += (model is not None) - (before is not None)
        if model is not None:
            group.num_new += 1
        if group.pooled is None or group.num_models == 0 or group.num_new >= self.refresh_fraction * group.num_models:
            changed |= self._refresh(group)
        return changed - {worker_id}

    def remove(self, worker_id: WorkerId) -> set[WorkerId]:
        """The worker left; returns the workers whose priced model changed."""
        kind = self._kind_of.pop(worker_id, None)
        if kind is None:
            return set()
        group = self._groups[kind]
        had_model = group.own.pop(worker_id, None) is not None
        group.num_models -= had_model
        if not group.own:
            del self._groups[kind]
            return set()
        return self._refresh(group) if had_model else set()

    def model_of(self, worker_id: WorkerId) -> StepTimeModel | None:
        """The model the worker is priced with: its kind's pooled model (None: no member of its
        kind publishes one)."""
        kind = self._kind_of.get(worker_id)
        return self._groups[kind].pooled if kind is not None else None

    def _refresh(self, group: _Group) -> set[WorkerId]:
        pooled = pooled_model([m for m in group.own.values() if m is not None])
        group.num_new = 0
        if _close(pooled, group.pooled):
            return set()
        group.pooled = pooled
        return set(group.own)


def _close(a: StepTimeModel | None, b: StepTimeModel | None) -> bool:
    """Whether `a` prices like `b`: every coefficient within SAME_WITHIN of it (refits of a
    steady fleet move its median by less; each change hands every member of the kind a new view)."""
    if a is None or b is None:
        return a is b
    a_terms, b_terms = (*a.coefficients, a.free_prefill_tokens), (*b.coefficients, b.free_prefill_tokens)
    return all(abs(x - y) <= SAME_WITHIN * max(abs(x), abs(y)) for x, y in zip(a_terms, b_terms))


def pooled_model(models: list[StepTimeModel]) -> StepTimeModel | None:
    """Each coefficient's median over `models` (None for none); the samples behind it, summed,
    and the median of their errors."""
    if not models:
        return None
    if len(models) == 1:
        return models[0]
    coefficients = tuple(statistics.median(m.coefficients[i] for m in models) for i in range(NUM_COEFFICIENTS))
    return StepTimeModel(
        coefficients,
        sum(m.num_samples for m in models),
        statistics.median(m.mean_abs_pct_error for m in models),
        all(m.seeded_from_profile for m in models),
        statistics.median(m.free_prefill_tokens for m in models),
    )
