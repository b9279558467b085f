"""GPU, model and link specifications, read from the data files beside this module.

Each entry of data/gpus.json, data/models.json and data/links.json cites where its numbers come
from. Names are case-insensitive and a GPU may have aliases (`h100` = `h100-sxm`). The KV size of a
model follows its real layout (kvplane.types.KVLayout):

    KV bytes per token = 2 (K and V) x layers x KV heads x head_dim x dtype bytes
    (Llama-3-70B, GQA, bf16: 2 x 80 x 8 x 128 x 2 = 327,680 B; 4,096 tokens = 1.34 GB)

and a transfer over a link takes bytes x 8 / line rate + the link's fixed latency
(1.34 GB: 107 ms at 100 Gb/s, 27 ms at 400 Gb/s).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvplane.types import KVLayout, dtype_nbytes

DATA_DIR = Path(__file__).parent / "data"


@dataclass(frozen=True, slots=True)
class GpuSpec:
    key: str
    name: str
    peak_flops: float  # dense BF16 FLOP/s
    hbm_bytes_per_s: float
    memory_bytes: float
    nvlink_bytes_per_s: float  # per GPU, both directions together
    source: str


@dataclass(frozen=True, slots=True)
class ModelSpec:
    key: str
    num_params: float
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    dtype: str  # weights and KV
    source: str

    def layout(self, block_size: int) -> KVLayout:
        return KVLayout(self.key, self.num_layers, self.num_kv_heads, self.head_dim, self.dtype, block_size)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layout(1).bytes_per_token

    @property
    def weight_bytes(self) -> float:
        return self.num_params * dtype_nbytes(self.dtype)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    key: str
    bits_per_s: float
    latency_s: float
    source: str

    def transfer_seconds(self, num_bytes: int) -> float:
        """Seconds to move num_bytes in one transfer (0 bytes: nothing moves, no latency)."""
        if num_bytes <= 0:
            return 0.0
        return num_bytes * 8 / self.bits_per_s + self.latency_s


@functools.cache
def _entries(kind: str) -> dict[str, dict[str, Any]]:
    raw = json.loads((DATA_DIR / f"{kind}.json").read_text())
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def _lookup(kind: str, name: str) -> tuple[str, dict[str, Any]]:
    entries = _entries(kind)
    wanted = name.strip().lower()
    for key, entry in entries.items():
        if wanted == key or wanted in entry.get("aliases", ()):
            return key, entry
    raise ValueError(f"unknown {kind[:-1]} {name!r}; known: {', '.join(names(kind))}")


def names(kind: str) -> list[str]:
    """Known names of `kind` ("gpus", "models" or "links"), aliases included."""
    entries = _entries(kind)
    return [n for key, entry in entries.items() for n in (key, *entry.get("aliases", ()))]


def gpu(name: str) -> GpuSpec:
    key, e = _lookup("gpus", name)
    return GpuSpec(
        key, e["name"], e["peak_tflops"] * 1e12, e["hbm_gb_per_s"] * 1e9, e["memory_gb"] * 1e9, e["nvlink_gb_per_s"] * 1e9, e["source"]
    )


def model(name: str) -> ModelSpec:
    key, e = _lookup("models", name)
    return ModelSpec(
        key, e["params_b"] * 1e9, e["num_layers"], e["hidden_size"], e["num_heads"], e["num_kv_heads"], e["head_dim"],
        e["vocab_size"], e["max_context"], e["dtype"], e["source"],
    )  # fmt: skip


def link(name: str) -> LinkSpec:
    key, e = _lookup("links", name)
    return LinkSpec(key, e["gbit_per_s"] * 1e9, e["latency_us"] * 1e-6, e["source"])
