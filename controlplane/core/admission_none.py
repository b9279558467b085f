"""Admission policy `none`: admit everything (benchmarks, single-user setups). Parameters: none."""

from __future__ import annotations

from kvplane.controlplane.core.admission_base import AdmissionConfig, Admit, Reject


class AdmitAll:
    __slots__ = ()

    def __init__(self, config: AdmissionConfig) -> None:
        del config  # nothing to configure; same constructor shape as every policy

    def decide(self, request, candidates, options=(), objective=None) -> Admit | Reject:
        return Admit()
