"""Throughput of the checks on imported KV (dataplane/transport/integrity.py), not a test:

    python -m tests.transport.bench_integrity [cpu|cuda]

A pool of 64 blocks of a Llama-3-8B-like layout (32 layers, 8 KV heads, head dim 128, 16 tokens a
block: 2 MiB a block in float16); every other block is checked; the median of 5 rounds each.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from kvplane.dataplane.transport.integrity import block_digests, check_imported, non_finite_blocks
from kvplane.types import KVLayout

from .kv_peer import filled_pool

ROUNDS = 5


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    for dtype in ("float16", "float32"):
        layout = KVLayout(model="m", num_layers=32, num_kv_heads=8, head_dim=128, dtype=dtype, block_size=16)
        pool = filled_pool(layout, num_blocks=64, seed=1)
        pool.buffer = pool.buffer.to(device)
        block_ids = list(range(0, 64, 2))
        digests = block_digests(pool, block_ids)
        nbytes = len(block_ids) * layout.block_nbytes
        for name, run, args in [
            ("digests", block_digests, (pool, block_ids)),
            ("finite check", non_finite_blocks, (pool, block_ids)),
            ("whole import check", check_imported, (pool, block_ids, digests)),
        ]:
            seconds = []
            for _ in range(ROUNDS):
                started = time.perf_counter()
                run(*args)
                if device != "cpu":
                    torch.cuda.synchronize()
                seconds.append(time.perf_counter() - started)
            median = statistics.median(seconds)
            print(f"{device} {dtype} {name}: {nbytes / 2**20:.0f} MiB in {median * 1000:.1f} ms = {nbytes / median / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
