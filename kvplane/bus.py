"""What travels on the control plane's NATS bus, shared by its replicas and by the agents that
publish their load reports and KV event batches there themselves (`kvplane controlplane
--bus-for-agents`).

Subjects: `kvplane.<kind>.<worker id, hex>` (hex because a worker id may hold '.', NATS's subject
separator), kind "load" (load reports), "kv" (KV event batches) or "keepalive" (an agent's lease
renewals: NATS requests that one replica of the queue group KEEPALIVE_QUEUE answers, with a
KeepAliveResponse, or with ERROR_HEADER when it could not renew and the agent should ask over gRPC).

Message authentication. Once workers can reach the bus, any of them could publish on another's
subject, so every message carries a MAC in the `Kvplane-Mac` header: HMAC-SHA256 over the kind and
the payload, keyed per registration (worker id and lease, both in the payload). A worker signs
with its registration's session token, which the control plane derives from its session key and
gives to that worker alone (controlplane/secrets.py), so a worker can publish its own messages and
nobody else's; every replica applies a KV batch so signed only within the limits a replica checks
on a PublishKVEvents call (controlplane/batch_limits.py), and a load report only with its running
list within MAX_RUNNING_LISTED. What a replica publishes for a worker that called it carries the
worker's key for a load report and, for a KV batch it has checked, a key derived from the session
key and the token, which only replicas can derive. A replica recomputes the keys from the
message's worker id and lease and drops a message whose MAC matches neither before it applies it.
The payload never carries the token. A copied message published again is caught by the numbers
inside: load reports by `report_seq`, KV batches by `seq` (a replica applies each only above the
last it applied; a snapshot, the worker's whole truth, is applied again), keep-alives by
`keepalive_seq` (a replica answers each only above the last it answered for that lease; another
replica of the group may answer a copy once, which renews a lease its worker renewed moments before).
"""

from __future__ import annotations

import hashlib
import hmac

MAC_HEADER = "Kvplane-Mac"
ERROR_HEADER = "Kvplane-Error"  # a replica's answer to a keep-alive it did not renew: why, for the agent's log
KEEPALIVE_QUEUE = "kvplane-replicas"  # the queue group whose one member answers each keep-alive
# Where JetStream answers an agent (a KV batch's acknowledgement, a purge's reply): an agent's own
# inbox prefix, so that NATS permissions can let agents subscribe there and nowhere else, as the
# nats-agents overlay does (deploy/k8s/overlays/nats/nats.conf). Under the default `_INBOX` they
# would also receive what the replicas' consumers are sent: every worker's reports and batches.
AGENT_INBOX_PREFIX = "_KVPLANE_AGENT_INBOX"
LOAD_STREAM = "KVPLANE_LOAD"  # the JetStream streams the replicas create (controlplane/bus/nats.py)
KV_STREAM = "KVPLANE_KV"


def subject(kind: str, worker_id: str) -> str:
    return f"kvplane.{kind}.{worker_id.encode().hex()}"


async def purge_before_snapshot(js, kv_subject: str, snapshot_seq: int) -> None:
    """Drops a worker's KV batches older than its snapshot at stream sequence `snapshot_seq`
    (`js`: a nats-py JetStream context). nats-server reads a purge's `seq` of 0 or 1 as no bound
    at all and drops the subject's every message, so a snapshot that is the stream's first
    message (a fresh or emptied server) would itself be dropped before replicas read it (seen:
    a replica never got an agent's first snapshot); nothing precedes sequence 1 anyway."""
    if snapshot_seq > 1:
        await js.purge_stream(KV_STREAM, subject=kv_subject, seq=snapshot_seq)


def server_urls(url: str) -> list[str]:
    """'nats://h1:4222,h2:4222' -> ['nats://h1:4222', 'nats://h2:4222'] (the first item's scheme for the rest)."""
    items = [item.strip() for item in url.split(",") if item.strip()]
    scheme = items[0].split("://", 1)[0]
    return [item if "://" in item else f"{scheme}://{item}" for item in items]


def mac(key: bytes, kind: str, payload: bytes) -> str:
    """The message's MAC, as the header carries it (hex)."""
    return hmac.digest(key, b"kvplane-bus\x00" + kind.encode() + b"\x00" + payload, hashlib.sha256).hex()


def mac_valid(key: bytes, kind: str, payload: bytes, carried: str) -> bool:
    return bool(carried) and hmac.compare_digest(mac(key, kind, payload), carried)
