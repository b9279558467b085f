"""What one KV event batch may carry, checked once here for both ways a batch arrives: a worker's
PublishKVEvents call (the replica answering it refuses with the status below) and a batch the
worker published on the bus itself (`--bus-for-agents`: every replica that applies it drops it)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from kvplane.security.limits import BLOCK_HASH_MAX_BYTES, KV_BATCH_MAX_HASHES, MAX_BLOCKS_PER_WORKER
from kvplane.v1 import registry_pb2


@dataclass(frozen=True, slots=True)
class BatchLimits:
    max_hashes: int = KV_BATCH_MAX_HASHES  # block hashes in one batch
    max_blocks: int = MAX_BLOCKS_PER_WORKER


def batch_problem(batch: registry_pb2.PublishKVEventsRequest, limits: BatchLimits, held: int) -> tuple[grpc.StatusCode, str] | None:
    """Why `batch` must not apply to a worker whose index holds `held` blocks (None: it may)."""
    if batch.seq == 0:
        return grpc.StatusCode.INVALID_ARGUMENT, "seq must be >= 1"
    num_hashes = num_stored = 0
    for event in batch.events:
        kind = event.WhichOneof("event")
        hashes = event.stored.block_hashes if kind == "stored" else event.removed.block_hashes if kind == "removed" else ()
        num_hashes += len(hashes)
        if kind == "stored":
            num_stored += len(hashes)
        if hashes and not 0 < min(map(len, hashes)) <= max(map(len, hashes)) <= BLOCK_HASH_MAX_BYTES:
            return grpc.StatusCode.INVALID_ARGUMENT, f"block hashes must be 1..{BLOCK_HASH_MAX_BYTES} bytes"
    if num_hashes > limits.max_hashes:
        return (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"a KV event batch carries at most {limits.max_hashes} block hashes, this one {num_hashes}: split it (snapshots too)",
        )
    if (0 if batch.snapshot else held) + num_stored > limits.max_blocks:
        return (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"worker {batch.worker_id} would hold more than {limits.max_blocks} blocks in the cache index; "
            "publish a snapshot of what it really holds",
        )
    return None
