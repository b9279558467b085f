"""Admission: refuse a request early, with a retry-after hint, when it cannot be served well.

One Protocol (admission_base.AdmissionPolicy), one module per policy, and this registry, the one
list of them, so policies are chosen by name (`--admission`, or the run-time setting
`admission.policy`), not by type checks at call sites:

- `none` (admission_none.py): admit everything;
- `threshold` (admission_threshold.py): reject when every candidate is over a load limit;
- `predictive` (admission_predictive.py): predict TTFT and TPOT per placement and admit to the
  best placement that meets the request's objectives.
"""

from __future__ import annotations

from collections.abc import Callable

from kvplane.controlplane.core.admission_base import AdmissionConfig, AdmissionPolicy
from kvplane.controlplane.core.admission_none import AdmitAll
from kvplane.controlplane.core.admission_predictive import PredictiveAdmission
from kvplane.controlplane.core.admission_threshold import ThresholdAdmission

_POLICIES: dict[str, Callable[[AdmissionConfig], AdmissionPolicy]] = {
    "none": AdmitAll,
    "predictive": PredictiveAdmission,
    "threshold": ThresholdAdmission,
}


def admission_policy_names() -> list[str]:
    return sorted(_POLICIES)


def check_admission_policy(name: str) -> None:
    if name not in _POLICIES:
        raise ValueError(f"admission policy {name!r} is unknown; choose one of {admission_policy_names()}")


def make_admission_policy(name: str, config: AdmissionConfig) -> AdmissionPolicy:
    """Build the policy called `name` with `config` (both validated)."""
    check_admission_policy(name)
    config.validate()
    return _POLICIES[name](config)
