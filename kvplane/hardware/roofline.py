"""Roofline step time: how long one engine step of a named model takes on a named GPU, with
tensor parallelism, from FLOPs and bytes alone (no measurement).

One step computes P prefill tokens (prefill_attention A = sum over its chunks of new x (context +
new / 2) query-key pairs) and one token for each of S decoding sequences holding C tokens of
context in all (kvplane.latency's step features). With N parameters, L layers, H query heads of
dimension D, KV bytes per token k, weight bytes W and tp GPUs:

    compute  = (2 N (P + S) + 4 L H D (A + C)) / (tp x peak FLOP/s x mfu)
    memory   = (W + k (C + P)) / (tp x HBM bytes/s x hbm_efficiency)
    comm     = 2 L x (allreduce_latency + 2 (tp - 1) / tp x (P + S) x hidden x 2 B / NVLink bytes/s)   (tp > 1)
    step     = step_overhead + max(compute, memory) + comm

2N FLOPs per token for the matmuls and 4 per query-key pair per head dimension for attention (QK^T
and AV) are the usual counts (Kaplan et al. 2020; DistServe and Vidur model prefill and decode the
same way). A prefill-heavy step is compute-bound, a decode step memory-bound: it reads every
weight once plus the batch's KV. Each layer all-reduces its attention and MLP outputs once each
across the tp GPUs (Megatron-style TP, ring all-reduce). The efficiencies and overheads are
assumptions, not measurements: RooflineConfig below holds their defaults (MFU 0.5 and 80 % of HBM
bandwidth are typical of serving engines; 1 ms of scheduling per step; 10 us per all-reduce).

KV capacity: the blocks that fit in tp x memory x gpu_memory_utilization after the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplane.hardware.specs import GpuSpec, ModelSpec


@dataclass(frozen=True, slots=True)
class RooflineConfig:
    mfu: float = 0.5  # share of peak FLOP/s a prefill reaches
    hbm_efficiency: float = 0.8  # share of HBM bandwidth a decode step reaches
    step_overhead_s: float = 0.001  # scheduling, launch and sampling per step
    allreduce_latency_s: float = 10e-6  # fixed cost of one tensor-parallel all-reduce
    gpu_memory_utilization: float = 0.9  # share of GPU memory the engine takes (weights + KV)

    def validate(self) -> RooflineConfig:
        for name in ("mfu", "hbm_efficiency", "gpu_memory_utilization"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"RooflineConfig.{name} must be in (0, 1], got {getattr(self, name)!r}")
        for name in ("step_overhead_s", "allreduce_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"RooflineConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        return self


class Roofline:
    """Step times of `model` on `tp` x `gpu` (see the module docstring)."""

    __slots__ = ("gpu", "model", "tp", "config", "_flops_per_s", "_bytes_per_s", "_attention_flops", "_comm_per_token_s", "_comm_fixed_s")

    def __init__(self, gpu: GpuSpec, model: ModelSpec, tp: int = 1, config: RooflineConfig | None = None) -> None:
        if tp < 1:
            raise ValueError(f"tensor parallelism must be >= 1, got {tp}")
        self.gpu, self.model, self.tp = gpu, model, tp
        self.config = (config or RooflineConfig()).validate()
        usable = tp * gpu.memory_bytes * self.config.gpu_memory_utilization
        if model.weight_bytes >= usable:
            raise ValueError(
                f"{model.key} has {model.weight_bytes / 1e9:.0f} GB of weights; {tp} x {gpu.key} "
                f"({usable / 1e9:.0f} GB usable) cannot hold them and any KV: raise the tensor parallelism"
            )
        c = self.config
        self._flops_per_s = tp * gpu.peak_flops * c.mfu
        self._bytes_per_s = tp * gpu.hbm_bytes_per_s * c.hbm_efficiency
        self._attention_flops = 4 * model.num_layers * model.num_heads * model.head_dim
        if tp > 1:
            per_token = 2 * (tp - 1) / tp * model.hidden_size * 2 / gpu.nvlink_bytes_per_s
            self._comm_per_token_s = 2 * model.num_layers * per_token
            self._comm_fixed_s = 2 * model.num_layers * c.allreduce_latency_s
        else:
            self._comm_per_token_s = self._comm_fixed_s = 0.0

    def step_seconds(
        self, prefill_tokens: int = 0, prefill_attention: int = 0, decode_seqs: int = 0, decode_context_tokens: int = 0
    ) -> float:
        tokens = prefill_tokens + decode_seqs
        if tokens <= 0:
            return 0.0
        m = self.model
        flops = 2 * m.num_params * tokens + self._attention_flops * (prefill_attention + decode_context_tokens)
        compute_s = flops / self._flops_per_s
        memory_s = (m.weight_bytes + m.kv_bytes_per_token * (decode_context_tokens + prefill_tokens)) / self._bytes_per_s
        comm_s = self._comm_fixed_s + self._comm_per_token_s * tokens
        return self.config.step_overhead_s + max(compute_s, memory_s) + comm_s

    def num_kv_blocks(self, block_size: int) -> int:
        """KV blocks of block_size tokens that fit beside the weights."""
        usable = self.tp * self.gpu.memory_bytes * self.config.gpu_memory_utilization - self.model.weight_bytes
        return int(usable // (self.model.kv_bytes_per_token * block_size))

    def describe(self) -> str:
        return f"{self.model.key} on {self.tp} x {self.gpu.key}"
