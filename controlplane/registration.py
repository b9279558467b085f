"""Whether a registering worker fits the cluster: the model it serves and its KV block size.

Rule: a worker is refused (FAILED_PRECONDITION, naming the field) when
- `model`: the cluster names the models it serves (`kvplane controlplane --serve-model`, repeatable)
  and the worker's is not one of them;
- `block_size`: the cluster fixes a block size (`--block-size`) and the worker's differs, or,
  without one, other registered workers of the same model use another block size.
Why block size: the router hashes a prompt into blocks of the model's block size and matches
them against what every worker holds (kvplane/block_hash.py); an external engine's KV events are
mapped onto those blocks one engine page to one kvplane block
(dataplane/engines/external/hash_map.py), so all workers of a model must share one size, and it
is the engine's own page/block size. A worker re-registering under its own id is not compared
with its previous record. Since this rule holds the workers of a model to one size, the first
other worker of the model answers for all of them: a registration does not walk the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvplane.v1 import common_pb2


def mismatch(
    info: common_pb2.WorkerInfo,
    registered: Iterable[common_pb2.WorkerInfo],
    models: tuple[str, ...] = (),
    block_size: int = 0,
) -> str | None:
    """A sentence starting with the field that does not fit, or None when the worker fits."""
    if models and info.model not in models:
        return (
            f"model: worker {info.worker_id} serves {info.model!r}, but this cluster serves {list(models)} "
            "(kvplane controlplane --serve-model); start its engine with one of those models (or served-model names)"
        )
    worker_block_size = info.layout.block_size
    if block_size and worker_block_size != block_size:
        return (
            f"block_size: worker {info.worker_id}'s engine uses {worker_block_size}-token KV blocks, but this cluster's "
            f"block size is {block_size} (kvplane controlplane --block-size); start the engine with that page/block size"
        )
    for other in registered:
        if other.worker_id == info.worker_id or other.model != info.model:
            continue
        if other.layout.block_size == worker_block_size:
            return None
        return (
            f"block_size: worker {info.worker_id}'s engine uses {worker_block_size}-token KV blocks, but worker "
            f"{other.worker_id} of model {info.model!r} uses {other.layout.block_size}; workers of one model must "
            "share one block size so their block hashes match"
        )
    return None
