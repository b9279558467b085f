"""KV transports: move pinned KV blocks from a prefill agent's pool into a decode agent's pool."""

from kvplane.dataplane.transport.base import (
    KVPoolLike,
    KVTransport,
    LayoutMismatchError,
    PullSource,
    TransferError,
    TransportError,
    TransportUnavailableError,
)
from kvplane.dataplane.transport.modeled import ModeledLink, ModeledLinkTransport
from kvplane.dataplane.transport.registry import TRANSPORT_NAMES, available_transports, make_transport, unavailable_reason

__all__ = [
    "KVPoolLike",
    "KVTransport",
    "LayoutMismatchError",
    "ModeledLink",
    "ModeledLinkTransport",
    "PullSource",
    "TRANSPORT_NAMES",
    "TransferError",
    "TransportError",
    "TransportUnavailableError",
    "available_transports",
    "make_transport",
    "unavailable_reason",
]
