"""The sampling-parameter rule every hop applies: what is refused and what counts as greedy.

- `temperature` must be a finite number >= 0; below MIN_TEMPERATURE (1e-5, as vLLM) it is greedy:
  dividing logits by a sub-epsilon temperature overflows them to inf and the softmax to NaN, so
  a request asking for 1e-45 gets argmax instead of poisoning its engine step.
- `top_p` must be finite and within [0, 1] (0 or 1 = off); `top_k` must be >= 0 (0 = off).
NaN compares false with everything, so the checks are written as "must be within", never as
"refuse when below". Plain Python: the control plane, the agent and the engine all use it.
"""

from __future__ import annotations

import math

MIN_TEMPERATURE = 1e-5  # temperatures below this are greedy


def sampling_problem(temperature: float, top_p: float, top_k: int = 0) -> str | None:
    """A sentence naming what is wrong with these sampling values, or None when they are usable."""
    if not (math.isfinite(temperature) and temperature >= 0):
        return f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}"
    if not (math.isfinite(top_p) and 0 <= top_p <= 1):
        return f"top_p must be within [0, 1] (0 or 1 = off), got {top_p!r}"
    if top_k < 0:
        return f"top_k must be >= 0 (0 = off), got {top_k!r}"
    return None


def is_greedy(temperature: float) -> bool:
    """True for 0 and every temperature too small to sample with (see the module docstring)."""
    return temperature < MIN_TEMPERATURE


def effective_temperature(temperature: float) -> float:
    """The temperature to sample with: 0 (greedy) below MIN_TEMPERATURE, else unchanged."""
    return 0.0 if is_greedy(temperature) else temperature
