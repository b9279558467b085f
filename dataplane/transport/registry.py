"""Which KV transports this process can use, best first, and how to build one by name.

Preference: nixl (one-sided reads, no per-chunk Python work) when it imports and its UCX backend
starts, then grpc (always available). The NIXL probe runs once per process and is cached. A pool
without a tensor (torch-free host memory, the sim engine's) is served by grpc alone, and nixl is
not even probed for it: the nixl package imports torch.
"""

from __future__ import annotations

from typing import Any

from kvplane.dataplane.transport.base import KVPoolLike, KVTransport, TransportUnavailableError
from kvplane.dataplane.transport.grpc_stream import GrpcStreamTransport
from kvplane.dataplane.transport.nixl import NixlTransport, nixl_unavailable_reason

TRANSPORT_NAMES = ("nixl", "grpc")  # every transport kvplane knows, in preference order
_BYTE_STREAM_TRANSPORTS = ("grpc",)  # those that need no tensor, only the pool's bytes


def available_transports(pool: KVPoolLike | None = None) -> list[str]:
    """The transports that work in this process (over `pool`, when given), preferred first."""
    names = TRANSPORT_NAMES if pool is None or pool.buffer is not None else _BYTE_STREAM_TRANSPORTS
    return [name for name in names if unavailable_reason(name) is None]


def unavailable_reason(name: str) -> str | None:
    if name == "nixl":
        return nixl_unavailable_reason()
    if name == "grpc":
        return None
    raise ValueError(f"unknown KV transport {name!r}; known transports: {list(TRANSPORT_NAMES)}")


def make_transport(name: str, pool: KVPoolLike, *, agent_name: str = "", **options: Any) -> KVTransport:
    """Builds transport `name` over `pool`.

    agent_name: this worker's identity (the NIXL agent name is derived from it; grpc ignores it).
    options: passed to the transport's constructor (e.g. chunk_bytes for grpc, timeout_s for both);
    `credentials` (the worker's gRPC credentials) only to grpc: UCX has no notion of them.
    """
    credentials = options.pop("credentials", None)
    reason = unavailable_reason(name)
    if reason is None and pool.buffer is None and name not in _BYTE_STREAM_TRANSPORTS:
        reason = f"the pool is torch-free host memory (a simulated engine's); use {', '.join(_BYTE_STREAM_TRANSPORTS)}"
    if reason is not None:
        raise TransportUnavailableError(f"KV transport {name!r} is not available here: {reason}")
    if name == "grpc":
        return GrpcStreamTransport(pool, credentials=credentials, **options)
    return NixlTransport(pool, agent_name=agent_name, **options)
