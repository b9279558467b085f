"""Typed identifiers and small value types shared by the control plane and the data plane.

Plain Python only: no gRPC, etcd or torch imports, so algorithms can use them freely.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Literal, NewType, get_args

WorkerId = NewType("WorkerId", str)
BlockHash = NewType("BlockHash", bytes)
LeaseId = NewType("LeaseId", int)


class Role(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"

    # Plain attributes, set once below: the router reads them for every worker of every request.
    can_prefill: bool
    can_decode: bool


for _role in Role:
    _role.can_prefill = _role in (Role.PREFILL, Role.BOTH)
    _role.can_decode = _role in (Role.DECODE, Role.BOTH)
del _role


class Tier(enum.Enum):
    DEVICE = "device"
    HOST = "host"
    DISK = "disk"


# A KV transport whose name starts with this is an engine's own connector (SGLang's bootstrap
# rooms, vLLM's NixlConnector): it carries a remote prefill between two engines of that kind,
# but cannot fetch cached blocks (kvplane's own transports, "nixl" and "grpc", can).
NATIVE_TRANSPORT_PREFIX = "engine:"


def is_native_transport(name: str) -> bool:
    return name.startswith(NATIVE_TRANSPORT_PREFIX)


class DisaggMode(enum.Enum):
    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


# A request's priority: `interactive` is admitted or rejected at once; `batch` may wait in the
# control plane's batch queue and is shed first. The first name is the default.
Priority = Literal["interactive", "batch"]
PRIORITIES: tuple[Priority, ...] = get_args(Priority)


@dataclass(frozen=True, slots=True)
class Objective:
    """A latency objective: time to first token and time per output token, in milliseconds."""

    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True, slots=True)
class KVLayout:
    """What two pools must agree on before KV bytes can move between them."""

    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_size: int

    def mismatch(self, other: KVLayout) -> str | None:
        """A sentence naming the first field that differs, or None when the layouts match."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if mine != theirs:
                return f"KV layout mismatch on {f.name}: this side has {mine!r}, peer has {theirs!r}"
        return None

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_nbytes(self.dtype)

    @property
    def block_nbytes(self) -> int:
        return self.bytes_per_token * self.block_size


_DTYPE_NBYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def dtype_nbytes(dtype: str) -> int:
    try:
        return _DTYPE_NBYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown KV dtype {dtype!r}; expected one of {sorted(_DTYPE_NBYTES)}") from None
