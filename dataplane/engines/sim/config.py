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
    # Lower KV tiers per worker (tiers.py), in GiB of the model's real KV blocks; 0 = none.
    host_gib: float = 0.0
    disk_gib: float = 0.0
    # Host -> device per GPU: PCIe Gen5 x16 is 64 GB/s raw per direction (32 GT/s x 16 lanes);
    # ~50 GB/s is what pinned-memory cudaMemcpy reaches (H2D and D2H alike: the link is full
    # duplex, so offloads and loads each get it). A worker's tp GPUs each have their own link
    # and each moves its shard of the KV heads, so a worker moves tp x this.
    host_gb_per_s: float = 50.0
    # Disk -> host per worker: one NVMe PCIe Gen4 x4 drive, ~7 GB/s sequential read (e.g. Samsung
    # 990 Pro, 7.45 GB/s; writes ~6.9 GB/s are taken as the same); reads and spills share it.
    disk_gb_per_s: float = 7.0
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
        for name in ("host_gib", "disk_gib"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0 and value != float("inf")):
                raise ValueError(f"SimConfig.{name} must be a finite number >= 0, got {value!r}")
        for name in ("host_gb_per_s", "disk_gb_per_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"SimConfig.{name} must be a positive number, got {value!r}")
        if self.disk_gib and not self.host_gib:
            raise ValueError("SimConfig.disk_gib needs host_gib: the disk tier holds what the host tier evicts")
        if not self.speedup > 0:
            raise ValueError(f"SimConfig.speedup must be positive, got {self.speedup!r}")
        self.roofline.validate()
        self.roofline_model()  # the weights must fit
        if self.profile:
            profile_timing(self.profile)
        return self

    def hardware_label(self) -> str:
        """What the simulated worker runs on (EngineInfo.hardware): the GPU and its count, or the
        measured profile that replaces the roofline, and the speedup."""
        label = f"simulated {self.gpu} x{self.tp}" if not self.profile else f"simulated from profile {self.profile}"
        return label if self.speedup == 1 else f"{label} at {self.speedup:g}x"

    def roofline_model(self) -> Roofline:
        return Roofline(hardware.gpu(self.gpu), hardware.model(self.model), self.tp, self.roofline)

    def timing(self) -> StepTiming:
        """Step times: the measured profile when one is given, else the roofline."""
        return profile_timing(self.profile) if self.profile else self.roofline_model()

    def total_blocks(self) -> int:
        return self.num_blocks or self.roofline_model().num_kv_blocks(self.block_size)

    def block_nbytes(self) -> int:
        """The model's real bytes per KV block (what the tiers hold and the copy engine moves)."""
        return hardware.model(self.model).layout(self.block_size).block_nbytes

    def host_blocks(self) -> int:
        return int(self.host_gib * 2**30) // self.block_nbytes()

    def disk_blocks(self) -> int:
        return int(self.disk_gib * 2**30) // self.block_nbytes()

    def host_load_bytes_per_s(self) -> float:
        """A worker's host -> device rate: its tp GPUs' PCIe links together."""
        return self.host_gb_per_s * 1e9 * self.tp

    def disk_load_bytes_per_s(self) -> float:
        return self.disk_gb_per_s * 1e9
