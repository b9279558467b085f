"""Simulated hardware: GPU, model and link specifications (data files with their sources), the
roofline step-time model and measured-profile timing. Plain Python; no torch, gRPC or clock.

Used by the sim engine (dataplane/engines/sim), `kvplane sim` and `kvplane plan`.
"""

from kvplane.hardware.roofline import Roofline, RooflineConfig
from kvplane.hardware.specs import GpuSpec, LinkSpec, ModelSpec, gpu, link, model, names
from kvplane.hardware.timing import StepTiming, profile_timing

__all__ = [
    "GpuSpec",
    "LinkSpec",
    "ModelSpec",
    "Roofline",
    "RooflineConfig",
    "StepTiming",
    "gpu",
    "link",
    "model",
    "names",
    "profile_timing",
]
