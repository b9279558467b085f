"""The cluster's secrets: the ticket-signing key, the session-token key and the cache-salt key,
shared through the store.

The first replica to start creates them (a transaction that only writes absent keys, so two
replicas starting at once agree on one set); every replica reads them from the store. They never
appear in an RPC reply: agents get only the signing key's public half.

A tenant's cache salt is HMAC(cache-salt key, tenant) (kvplane.security.identity.tenant_cache_salt):
every replica derives the same salt, and nobody outside the replicas can compute it from the name.

A worker's session token is HMAC-SHA256(session key, worker id, lease id): any replica can check
it without a store read, and it names exactly one registration, so a worker can renew, report for
and deregister only its own. It also keys the MAC of the messages a worker publishes on the bus
itself; what a replica publishes after checking it carries one keyed by replica_bus_key (kvplane/bus.py).
"""

from __future__ import annotations

import hmac
import os
import struct
from dataclasses import dataclass

from kvplane import tickets
from kvplane.controlplane import keys
from kvplane.controlplane.store.base import Compare, Put, Store


@dataclass(frozen=True, slots=True)
class ClusterSecrets:
    signing_key: bytes
    session_key: bytes
    cache_salt_key: bytes

    def session_token(self, worker_id: str, lease_id: int) -> bytes:
        message = b"kvplane-session\x00" + worker_id.encode() + b"\x00" + struct.pack("<q", lease_id)
        return hmac.digest(self.session_key, message, "sha256")  # one call in C: a replica checks a bus message's MAC with it

    def session_valid(self, worker_id: str, lease_id: int, token: bytes) -> bool:
        return bool(token) and hmac.compare_digest(self.session_token(worker_id, lease_id), token)

    def bus_key(self, kind: str, worker_id: str, lease_id: int) -> bytes:
        """The key a replica signs a bus message with (kvplane/bus.py): a load report's is the
        registration's session token (its worker may publish one too), a KV batch's the replicas' key."""
        return self.session_token(worker_id, lease_id) if kind == "load" else self.replica_bus_key(worker_id, lease_id)

    def replica_bus_key(self, worker_id: str, lease_id: int) -> bytes:
        """The key of a bus message only a replica can sign: one whose limits a replica checked."""
        token = self.session_token(worker_id, lease_id)
        return hmac.digest(self.session_key, b"kvplane-bus-kv\x00" + token, "sha256")


async def load_or_create(store: Store) -> ClusterSecrets:
    values = {}
    made = ((keys.TICKET_SIGNING_KEY, tickets.new_signing_key), (keys.SESSION_KEY, _random_key), (keys.CACHE_SALT_KEY, _random_key))
    for key, make in made:
        await store.transaction([Compare.absent(key)], [Put(key, make())])
        kv = await store.get(key)
        assert kv is not None, f"{key} vanished right after it was written"
        values[key] = kv.value
    return ClusterSecrets(values[keys.TICKET_SIGNING_KEY], values[keys.SESSION_KEY], values[keys.CACHE_SALT_KEY])


def _random_key() -> bytes:
    return os.urandom(32)
