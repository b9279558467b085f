"""How load reports and KV events reach every replica: one Bus interface, three backends.

`open_bus(url, store)` is the only place a backend is chosen:
  "auto" (the default)        "memory" with the embedded store, "store" with etcd
  "memory"                    in-process: one replica (memory.py)
  "store"                     keys in the store, read by each replica's store watch (store.py)
  "nats://host:port[,...]"    NATS JetStream, for several replicas and large fleets (nats.py);
  "tls://host:port[,...]"     the same over TLS (`tls`, an ssl.SSLContext)
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from kvplane.controlplane.store.base import Store

from .base import Bus, BusError, BusMessage, BusUnavailable
from .memory import MemoryBus
from .store import StoreBus

ACCEPTED_URL_FORMS = ('"auto"', '"memory"', '"store"', '"nats://host:port[,host:port...]"', '"tls://host:port[,...]"')

__all__ = ["ACCEPTED_URL_FORMS", "Bus", "BusError", "BusMessage", "BusUnavailable", "MemoryBus", "StoreBus", "check_bus_url", "open_bus"]


def check_bus_url(url: str, store_url: str = "memory") -> str:
    """The backend a URL names ("memory", "store" or "nats"); ValueError naming the accepted forms otherwise."""
    if url == "auto":
        return "memory" if store_url in ("memory", "memory://") else "store"
    if url in ("memory", "memory://"):
        return "memory"
    if url == "store":
        return "store"
    if url.startswith(("nats://", "tls://")) and url.split("://", 1)[1].strip(", "):
        return "nats"
    raise ValueError(f"unsupported bus {url!r}; use one of {', '.join(ACCEPTED_URL_FORMS)}")


def open_bus(
    url: str,
    store: Store,
    *,
    store_url: str = "memory",
    kv_compact_every_s: float = 10.0,
    tls: ssl.SSLContext | None = None,
    stream_replicas: int = 1,
    mac_key: Callable[[str, str, int], bytes] | None = None,
) -> Bus:
    """`mac_key(kind, worker id, lease)`: the key of the MAC a NATS message carries (kvplane/bus.py)."""
    kind = check_bus_url(url, store_url)
    if kind == "memory":
        return MemoryBus()
    if kind == "store":
        return StoreBus(store, kv_compact_every_s=kv_compact_every_s)
    from .nats import NatsBus  # imported here so the other backends never need nats-py

    return NatsBus(url, tls=tls, kv_compact_every_s=kv_compact_every_s, replicas=stream_replicas, mac_key=mac_key)
