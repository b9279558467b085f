"""The cluster's secrets: the ticket-signing key and the session-token key, shared through the store.

The first replica to start creates them (a transaction that only writes absent keys, so two
replicas starting at once agree on one pair); every replica reads them from the store. They never
appear in an RPC reply: agents get only the signing key's public half.

A worker's session token is HMAC-SHA256(session key, worker id, lease id): any replica can check
it without a store read, and it names exactly one registration, so a worker can renew, report for
and deregister only its own.
"""

from __future__ import annotations

import hashlib
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

    def session_token(self, worker_id: str, lease_id: int) -> bytes:
        message = b"kvplane-session\x00" + worker_id.encode() + b"\x00" + struct.pack("<q", lease_id)
        return hmac.new(self.session_key, message, hashlib.sha256).digest()

    def session_valid(self, worker_id: str, lease_id: int, token: bytes) -> bool:
        return bool(token) and hmac.compare_digest(self.session_token(worker_id, lease_id), token)


async def load_or_create(store: Store) -> ClusterSecrets:
    values = {}
    for key, make in ((keys.TICKET_SIGNING_KEY, tickets.new_signing_key), (keys.SESSION_KEY, lambda: os.urandom(32))):
        await store.transaction([Compare.absent(key)], [Put(key, make())])
        kv = await store.get(key)
        assert kv is not None, f"{key} vanished right after it was written"
        values[key] = kv.value
    return ClusterSecrets(values[keys.TICKET_SIGNING_KEY], values[keys.SESSION_KEY])
