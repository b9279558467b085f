"""Shared state for control-plane replicas: one Store interface, two backends.

`open_store(url)` is the only place a backend is chosen:
  "memory" or "memory://"   embedded in-memory store (single machine; a new, empty store per call)
  "etcd://host:port"        etcd v3 server; `tls` (a kvplane.security.Credentials: etcd's CA, and a
                            client certificate whose CN etcd takes as the user) and `username` /
                            `password` turn on etcd's own transport security and auth
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

ACCEPTED_URL_FORMS = ('"memory"', '"memory://"', '"etcd://host:port"')

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
    parts = urlsplit(url)
    if parts.scheme == "etcd" and not parts.path and not parts.query:
        try:
            host, port = parts.hostname, parts.port
        except ValueError:  # a non-numeric or out-of-range port
            host, port = None, None
        if host and port:
            from .etcd import EtcdStore  # imported here so the memory backend never loads grpc/aetcd

            return EtcdStore(host, port, tls=tls, username=username, password=password)
    raise ValueError(f"unsupported store URL {url!r}; use one of {', '.join(ACCEPTED_URL_FORMS)}")
