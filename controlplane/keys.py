"""Where the control plane keeps things in the store. Replicas share nothing else.

/kvplane/workers/<id>       WorkerInfo            under the worker's lease
/kvplane/load/<id>          ReportLoadRequest     under the worker's lease, overwritten per report
/kvplane/kv/<id>/<seq:020>  PublishKVEventsRequest under the worker's lease; a snapshot batch
                            replaces everything before it, so older batches are compacted away
/kvplane/config/ticket_signing_key  Ed25519 private key that signs tickets, and
/kvplane/config/session_key  HMAC key of workers' session tokens, and
/kvplane/config/cache_salt_key  HMAC key of tenants' cache salts: all three created once by whichever
                            replica starts first, read by the others, never sent in any reply
                            (etcd's own TLS and auth keep them from anyone but the replicas)
/kvplane/config/settings/<key>  run-time settings (`kvplane config set`), watched by every replica
/kvplane/profiles/<id>      LatencyProfile measured by `kvplane profile`; no lease, so a restarted
                            worker starts from it
/kvplane/resync/<id>        the KV event seq after which a replica found a gap: the worker is asked
                            for a snapshot; deleted once one arrives (or the worker registers again)
"""

from __future__ import annotations

ROOT = "/kvplane/"
WORKERS = ROOT + "workers/"
LOAD = ROOT + "load/"
KV = ROOT + "kv/"
TICKET_SIGNING_KEY = ROOT + "config/ticket_signing_key"
SESSION_KEY = ROOT + "config/session_key"
CACHE_SALT_KEY = ROOT + "config/cache_salt_key"
SETTINGS = ROOT + "config/settings/"
PROFILES = ROOT + "profiles/"
RESYNC = ROOT + "resync/"


def resync_key(worker_id: str) -> str:
    return RESYNC + worker_id


def setting_key(name: str) -> str:
    return SETTINGS + name


def profile_key(worker_id: str) -> str:
    return PROFILES + worker_id


def worker_key(worker_id: str) -> str:
    return WORKERS + worker_id


def load_key(worker_id: str) -> str:
    return LOAD + worker_id


def kv_prefix(worker_id: str) -> str:
    return f"{KV}{worker_id}/"


def kv_key(worker_id: str, seq: int) -> str:
    return f"{kv_prefix(worker_id)}{seq:020d}"


def parse_kv_key(key: str) -> tuple[str, int]:
    worker_id, _, seq = key[len(KV) :].rpartition("/")
    return worker_id, int(seq)
