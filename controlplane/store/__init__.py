"""Shared state for control-plane replicas: one Store interface, two backends.

`open_store(url)` is the only place a backend is chosen:
  "memory" or "memory://"             embedded in-memory store (single machine; a new, empty store per call)
  "etcd://host:port"                  etcd v3 server
  "etcd://h1:2379,h2:2379,h3:2379"    the members of one etcd cluster; calls fail over between them
For etcd, `tls` (a kvplane.security.Credentials: etcd's CA, and a client certificate whose CN etcd
takes as the user) and `username` / `password` turn on etcd's own transport security and auth.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from .base import (
    Compare,
    Delete,
    EventType,
    KeyValue,
    LeaseNotFound,
    Op,
    Put,
    Store,
    StoreCompacted,
    StoreError,
    StoreUnavailable,
    WatchEvent,
)
from .memory import MemoryStore

ACCEPTED_URL_FORMS = ('"memory"', '"memory://"', '"etcd://host:port"', '"etcd://host:port,host:port,..."')

__all__ = [
    "ACCEPTED_URL_FORMS",
    "Compare",
    "Delete",
    "EventType",
    "KeyValue",
    "LeaseNotFound",
    "MemoryStore",
    "Op",
    "Put",
    "Store",
    "StoreCompacted",
    "StoreError",
    "StoreUnavailable",
    "WatchEvent",
    "open_store",
]


def open_store(url: str, *, tls=None, username: str | None = None, password: str | None = None) -> Store:
    """Build the store a URL names. Raises ValueError naming the accepted forms otherwise."""
    if url in ("memory", "memory://"):
        return MemoryStore()
    members = _etcd_members(url)
    if members:
        from .etcd import EtcdStore  # imported here so the memory backend never loads grpc/aetcd

        return EtcdStore(members, tls=tls, username=username, password=password)
    raise ValueError(f"unsupported store URL {url!r}; use one of {', '.join(ACCEPTED_URL_FORMS)}")


def _etcd_members(url: str) -> list[tuple[str, int]]:
    """[(host, port), ...] of an etcd URL, or [] when `url` is not one."""
    if not url.startswith("etcd://"):
        return []
    members = []
    for item in url[len("etcd://") :].split(","):
        parts = urlsplit(f"etcd://{item}")
        try:
            host, port = parts.hostname, parts.port
        except ValueError:  # a non-numeric or out-of-range port
            return []
        if parts.path or parts.query or not host or not port:
            return []
        members.append((host, port))
    return members
