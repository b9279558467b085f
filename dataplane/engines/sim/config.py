"""SimConfig: the one source of defaults for the sim engine (a simulated GPU, dataplane/engines/sim)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvplane import hardware
from kvplane.hardware import Roofline, RooflineConfig, StepTiming, profile_timing


@dataclass(slots=True)
class SimConfig:
    gpu: str = "h100-sxm"  # kvplane/hardware/data/gpus.json
    model: str = "llama-3-70b"  # kvplane/hardware/data/models.json; also the served model name
    tp: int = 4  # tensor parallelism: GPUs per worker
    link: str = "400gbe"  # kvplane/hardware/data/links.json: the link KV crosses between workers
    profile: str = ""  # a `kvplane profile --json` file: its step-time model replaces the roofline
    roofline: RooflineConfig = field(default_factory=RooflineConfig)
    block_size: int = 16
    num_blocks: int = 0  # 0 = the blocks that fit in GPU memory beside the weights
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192  # tokens per step; longer prompts prefill in chunks
    max_tokens_limit: int = 4096
    payload_bytes: int = 64  # bytes stored and moved per block (the model's real block size is modeled)
    speedup: float = 1.0  # simulated seconds per wall second (in an agent; `kvplane sim` has no wall clock)
    seed: int = 0  # generated tokens

    def validate(self) -> SimConfig:
        """Raise ValueError naming the first bad field; returns self so calls can chain."""
        hardware.gpu(self.gpu)
        hardware.model(self.model)
        hardware.link(self.link)
        for name in ("tp", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_tokens_limit"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SimConfig.{name} must be a positive integer, got {value!r}")
        for name in ("num_blocks", "payload_bytes", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"SimConfig.{name} must be a non-negative integer, got {value!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"SimConfig.max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                f"({self.max_num_seqs}) so every running request can decode each step"
            )
        if not self.speedup > 0:
            raise ValueError(f"SimConfig.speedup must be positive, got {self.speedup!r}")
        self.roofline.validate()
        self.roofline_model()  # the weights must fit
        if self.profile:
            profile_timing(self.profile)
        return self

    def roofline_model(self) -> Roofline:
        return Roofline(hardware.gpu(self.gpu), hardware.model(self.model), self.tp, self.roofline)

    def timing(self) -> StepTiming:
        """Step times: the measured profile when one is given, else the roofline."""
        return profile_timing(self.profile) if self.profile else self.roofline_model()

    def total_blocks(self) -> int:
        return self.num_blocks or self.roofline_model().num_kv_blocks(self.block_size)
