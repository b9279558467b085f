"""EngineConfig: the one source of defaults for the reference engine."""

from __future__ import annotations

from dataclasses import dataclass

BUILTIN_MODEL = "builtin-tiny"
BUILTIN_WIDE_MODEL = "builtin-wide"  # KV-heavy, for transfer benchmarks
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(slots=True)
class EngineConfig:
    model: str = BUILTIN_MODEL  # "builtin-tiny" or a local HF-style directory
    served_model_name: str = ""  # "" = derived from the model (see weights.model_name_for)
    block_size: int = 16
    num_blocks: int = 512
    max_num_seqs: int = 16  # requests running at once (the decode batch)
    max_tokens_limit: int = 1024  # largest max_tokens a request may ask for
    max_num_batched_tokens: int = 2048  # tokens per step; longer prompts prefill in chunks
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0  # builtin weights and requests without their own sampling seed
    # Lower KV tiers (dataplane/engine/tiers.py). 0 = no host tier. The host tier holds a copy of
    # every cached device block (write-through), so make it larger than num_blocks.
    num_host_blocks: int = 0
    disk_dir: str = ""  # "" = no disk tier; needs a host tier (blocks spill host -> disk)
    num_disk_blocks: int = 65536
    # Tier loads run on the tiers' copy thread and the request joins the batch when its blocks are
    # in; True copies inside the engine step instead (the old path: a baseline for benchmarks).
    sync_tier_loads: bool = False
    host_load_gbs: float = 0.0  # > 0 caps host -> device loads at this many GB/s (a PCIe link modelled on CPU)

    def validate(self) -> EngineConfig:
        """Raise ValueError naming the first bad field; returns self so calls can chain."""
        if not self.model:
            raise ValueError("EngineConfig.model is empty; use 'builtin-tiny' or a local model directory")
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_tokens_limit", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"EngineConfig.{name} must be a positive integer, got {value!r}")
        for name in ("num_host_blocks", "num_disk_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"EngineConfig.{name} must be a non-negative integer, got {value!r}")
        if (
            isinstance(self.host_load_gbs, bool)
            or not isinstance(self.host_load_gbs, (int, float))
            or not 0 <= self.host_load_gbs < float("inf")
        ):
            raise ValueError(f"EngineConfig.host_load_gbs must be a finite number >= 0 (0 = unthrottled), got {self.host_load_gbs!r}")
        if self.disk_dir and self.num_host_blocks == 0:
            raise ValueError("EngineConfig.disk_dir needs a host tier (num_host_blocks > 0): blocks spill host -> disk")
        if self.disk_dir and self.num_disk_blocks == 0:
            raise ValueError("EngineConfig.num_disk_blocks must be positive when disk_dir is set")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"EngineConfig.max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs}) so every running request can decode each step"
            )
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"EngineConfig.dtype {self.dtype!r} is not supported; use one of {SUPPORTED_DTYPES}")
        if not (self.device == "cpu" or self.device == "cuda" or self.device.startswith("cuda:")):
            raise ValueError(f"EngineConfig.device {self.device!r} is not supported; use 'cpu', 'cuda' or 'cuda:N'")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"EngineConfig.seed must be a non-negative integer, got {self.seed!r}")
        return self
