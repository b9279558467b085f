"""Bounds every server enforces, written once; and `clip`, so that no error message echoes unbounded input.

The numbers are defaults: the control plane's are fields of ControlPlaneConfig (flags), these
are the ones both sides must agree on or that have no flag.
"""

from __future__ import annotations

SERVER_MAX_RECEIVE_BYTES = 8 * 1024 * 1024  # a request message; KV flows server -> client, so pulls are not bound by it
KV_BATCH_MAX_HASHES = 8192  # block hashes in one PublishKVEvents batch (about 300 KB in the store, far under etcd's 1.5 MiB)
BLOCK_HASH_MAX_BYTES = 64  # a block hash is a digest: 32 bytes for kvplane's SHA-256 chain
MAX_PROMPT_BYTES = 1024 * 1024  # prompt text, checked before tokenization
MAX_ID_CHARS = 128  # request ids, transfer ids, worker ids in requests
CLIP_CHARS = 64


def clip(value: object, limit: int = CLIP_CHARS) -> str:
    """repr(value), cut to `limit` characters with the length it had: safe to put in a message."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, (str, bytes, list, tuple)) else len(text)
    return f"{text[:limit]}... ({size} long)"
