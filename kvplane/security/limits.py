"""Bounds every server enforces, written once; and `clip`, so that no error message echoes unbounded input.

The numbers are defaults: the control plane's are fields of ControlPlaneConfig (flags), these
are the ones both sides must agree on or that have no flag.

Connections (`ConnectionLimits`, applied by kvplane.grpc_util.make_server): a connection that has
not finished its TLS and HTTP/2 handshake within `handshake_timeout_s`, or carries no call for
`idle_timeout_s`, is closed by the server; one whose peer stops answering keepalive pings is
closed `keepalive_timeout_s` after the ping. gRPC has no per-peer connection cap, so the closest
bound is a cap on all of a server's connections: beyond `max_connections` new ones are closed at
once (docs/security.md#connections).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SERVER_MAX_RECEIVE_BYTES = 8 * 1024 * 1024  # a request message; KV flows server -> client, so pulls are not bound by it
KV_BATCH_MAX_HASHES = 8192  # block hashes in one PublishKVEvents batch (about 300 KB in the store, far under etcd's 1.5 MiB)
MAX_BLOCKS_PER_WORKER = 1 << 20  # blocks the cache index keeps for one worker
BLOCK_HASH_MAX_BYTES = 64  # a block hash is a digest: 32 bytes for kvplane's SHA-256 chain
MAX_PROMPT_BYTES = 1024 * 1024  # prompt text, checked before tokenization
CERT_DAYS = 365  # validity of the certificates `kvplane certs` makes
MAX_ID_CHARS = 128  # request ids, transfer ids, worker ids in requests
MAX_STREAM_INTERVAL = 4096  # tokens per streamed message (GenerateRequest.stream_interval)
MAX_RUNNING_LISTED = 65536  # requests a load report lists (WorkerLoad.running_remaining_tokens)
CLIP_CHARS = 64
# The HTTP API's request bodies (controlplane/http/guard.py): a 128k-token prompt as JSON ids is
# about 1 MiB, so is the largest text prompt; the parse of a body this size stays near 100 ms.
HTTP_MAX_BODY_BYTES = 4 * 1024 * 1024
HTTP_MAX_BODY_BYTES_CAP = 64 * 1024 * 1024  # what the flag may raise it to
HTTP_MAX_JSON_VALUES = 256 * 1024  # values (numbers, strings, lists, objects) in one body: bounds its parse time
HTTP_MAX_PROMPTS = 256  # prompts in one completions request (one choice each)


def clip(value: object, limit: int = CLIP_CHARS) -> str:
    """repr(value), cut to `limit` characters with the length it had: safe to put in a message."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, (str, bytes, list, tuple)) else len(text)
    return f"{text[:limit]}... ({size} long)"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one gRPC server lets connections hold (see the module docstring)."""

    handshake_timeout_s: float = 10.0  # TCP accepted -> TLS and HTTP/2 settings done (gRPC's default: 120 s)
    idle_timeout_s: float = 300.0  # no call on the connection this long: closed (GOAWAY); clients reconnect on their next call
    keepalive_time_s: float = 30.0  # the server pings a quiet connection this often ...
    keepalive_timeout_s: float = 10.0  # ... and closes it when the ack does not come this soon (a peer that vanished)
    max_connections: int = 4096  # all of the server's connections at once; more are closed on accept
    max_streams_per_connection: int = 4096  # concurrent calls on one connection; more wait on the client side

    def validate(self) -> ConnectionLimits:
        for name in ("handshake_timeout_s", "idle_timeout_s", "keepalive_time_s", "keepalive_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.001 <= value <= 86_400):
                raise ValueError(f"{name} must be between 0.001 and 86400 seconds, got {value!r}")
        for name in ("max_connections", "max_streams_per_connection"):
            if not 1 <= getattr(self, name) < 2**31:
                raise ValueError(f"{name} must be in 1..2^31-1, got {getattr(self, name)!r}")
        return self
