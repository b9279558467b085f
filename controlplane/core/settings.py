"""Cluster settings changed at run time (`kvplane config set KEY VALUE`), kept in the store.

Keys and values are strings so the store, the RPC and the CLI stay simple; this module is the one
place that knows the keys, validates values and turns them into typed settings:

- `admission.policy`: an admission policy name (admission.admission_policy_names()).
- `objectives.<model>.<priority>.ttft_ms` / `.tpot_ms`: a latency objective in milliseconds for
  one model (or `*` for every model) and priority (kvplane.types.PRIORITIES). The most specific key wins:
  model before `*`, `*` before the defaults below. A value is a finite number of milliseconds in
  (0, MAX_OBJECTIVE_MS]: `inf` or `1e300` would switch admission off without saying so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from kvplane.controlplane.core.admission import admission_policy_names
from kvplane.types import PRIORITIES, Objective, Priority

ANY_MODEL = "*"
MAX_OBJECTIVE_MS = 3_600_000.0  # an hour: beyond it no request is ever refused, say "no objective" by deleting the key
_OBJECTIVE_FIELDS = tuple(f.name for f in fields(Objective))

# Defaults sized for the reference engine on a small CPU; set real ones per model in production.
DEFAULT_OBJECTIVES: dict[Priority, Objective] = {
    "interactive": Objective(ttft_ms=2000.0, tpot_ms=200.0),
    "batch": Objective(ttft_ms=30000.0, tpot_ms=1000.0),
}


class SettingError(ValueError):
    """A key or value that `kvplane config set` must refuse; the message says what is accepted."""


def validate_setting(key: str, value: str) -> None:
    if key == "admission.policy":
        if value not in admission_policy_names():
            raise SettingError(f"admission.policy must be one of {admission_policy_names()}, got {value!r}")
        return
    parts = key.split(".")
    if len(parts) >= 4 and parts[0] == "objectives":
        model, priority, name = ".".join(parts[1:-2]), parts[-2], parts[-1]
        if not model:
            raise SettingError(f"{key!r}: name a model, or * for every model")
        if priority not in PRIORITIES:
            raise SettingError(f"{key!r}: priority must be one of {PRIORITIES}, got {priority!r}")
        if name not in _OBJECTIVE_FIELDS:
            raise SettingError(f"{key!r}: objective must be one of {_OBJECTIVE_FIELDS}, got {name!r}")
        try:
            number = float(value)
        except ValueError:
            raise SettingError(f"{key!r} must be a number of milliseconds, got {value!r}") from None
        if not (math.isfinite(number) and 0 < number <= MAX_OBJECTIVE_MS):
            raise SettingError(f"{key!r} must be a finite number of milliseconds in (0, {MAX_OBJECTIVE_MS:.0f}], got {value!r}")
        return
    raise SettingError(
        f"unknown setting {key!r}; settable: admission.policy, "
        f"objectives.<model|*>.<{'|'.join(PRIORITIES)}>.<{'|'.join(_OBJECTIVE_FIELDS)}>"
    )


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    values: Mapping[str, str] = field(default_factory=dict)

    def admission_policy(self, default: str) -> str:
        return self.values.get("admission.policy", default)

    def objective(self, model: str, priority: Priority) -> Objective:
        base = DEFAULT_OBJECTIVES[priority]
        values = {}
        for name in _OBJECTIVE_FIELDS:
            for scope in (model, ANY_MODEL):
                raw = self.values.get(f"objectives.{scope}.{priority}.{name}")
                if raw is not None:
                    values[name] = float(raw)
                    break
            else:
                values[name] = getattr(base, name)
        return Objective(**values)
