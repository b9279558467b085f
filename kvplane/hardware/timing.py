"""Where a simulated engine's step times come from: a roofline of a named GPU and model, or a
measured profile (the `kvplane profile --json` output of a real worker: the coefficients of its
fitted step-time model, kvplane.latency). Both answer step_seconds(prefill_tokens,
prefill_attention, decode_seqs, decode_context_tokens).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Protocol

from kvplane.latency import NUM_COEFFICIENTS, StepTimeModel


class StepTiming(Protocol):
    def step_seconds(
        self, prefill_tokens: int = 0, prefill_attention: int = 0, decode_seqs: int = 0, decode_context_tokens: int = 0
    ) -> float: ...


def profile_timing(path: str | Path) -> StepTimeModel:
    """The step-time model a `kvplane profile WORKER --json` file holds; ValueError saying what is wrong."""
    try:
        raw = json.loads(Path(path).read_text())
        coefficients = tuple(float(c) for c in raw["coefficients"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read a profile from {path} ({e}); write one with `kvplane profile WORKER --json > FILE`") from None
    if len(coefficients) != NUM_COEFFICIENTS or not all(math.isfinite(c) and c >= 0 for c in coefficients):
        raise ValueError(f"profile {path} must hold {NUM_COEFFICIENTS} non-negative coefficients, got {list(coefficients)}")
    return StepTimeModel(coefficients, int(raw.get("num_samples", 0)), float(raw.get("mean_abs_pct_error", 0.0)), True)
