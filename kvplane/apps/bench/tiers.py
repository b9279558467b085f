"""`kvplane bench tiers`: what loading a KV block from each tier costs next to recomputing it.

In one process, per model: recompute = the engine's prefill time of a prompt divided by its
blocks; host = TierStore.load of blocks held in the host pool (a copy into the device pool);
disk (page cache) = the same from the disk tier right after writing; disk (cold) = the same after
asking the kernel to drop the files from its page cache (posix_fadvise DONTNEED; best effort).
The tier's credit weight that these numbers justify is 1 - load / recompute: the share of the
recompute a cached block saves. The router's defaults (RouterConfig.overlap_weight_*) are
rounded down from these (docs/benchmarks.md). `--overlap` measures instead whether a load stalls
another request's decode (tiers_overlap.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from kvplane.apps.bench import tiers_overlap


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="builtin-tiny,builtin-wide", help="comma-separated builtin models (default %(default)s)")
    parser.add_argument("--blocks", type=int, default=64, help="blocks per measurement (default %(default)s)")
    parser.add_argument("--device", default="cpu", help="torch device of the device pool (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    tiers_overlap.add_arguments(parser)


def _prefill_ms_per_block(engine, num_blocks: int) -> float:
    import threading

    from kvplane.dataplane.engines import EngineRequest, SamplingParams

    bs = engine.config.block_size
    times = []
    for trial in range(3):
        prompt = [(trial * 7919 + i * 31) % 250 + 1 for i in range(num_blocks * bs + 1)]
        done = threading.Event()
        t0 = time.perf_counter()
        engine.submit(EngineRequest(f"p{trial}", prompt, SamplingParams(max_tokens=1)), lambda out, done=done: out.finished and done.set())
        done.wait()
        times.append((time.perf_counter() - t0) * 1000 / num_blocks)
    return min(times[1:])  # the first run warms up


def measure(model: str, num_blocks: int, device: str) -> dict:
    import torch

    from kvplane.dataplane.engines.reference import Engine, EngineConfig, TierStore

    engine = Engine(EngineConfig(model=model, num_blocks=num_blocks * 2 + 8, max_num_batched_tokens=num_blocks * 16 + 16,
                                 device=device))  # fmt: skip
    engine.start()
    try:
        recompute = _prefill_ms_per_block(engine, num_blocks)
    finally:
        engine.stop()
    pool = engine.pool
    pool.buffer.copy_(torch.randn(pool.buffer.shape, dtype=pool.buffer.dtype))
    hashes = [bytes([i % 256, i // 256]) * 8 for i in range(num_blocks)]
    ids = list(range(num_blocks))
    dst = list(range(num_blocks, 2 * num_blocks))
    rows = {"model": model, "block_bytes": pool.block_nbytes, "recompute_ms": recompute}
    with tempfile.TemporaryDirectory() as d:
        host = TierStore(pool, num_blocks, generation=lambda b: 0)
        host.enqueue(hashes, ids)
        host.flush()
        t0 = time.perf_counter()
        assert host.load(hashes, dst) == num_blocks
        sync(device)
        rows["host_ms"] = (time.perf_counter() - t0) * 1000 / num_blocks
        host.stop()
        # A one-block host tier spills everything else to disk.
        disk = TierStore(pool, 1, generation=lambda b: 0, disk_dir=d, num_disk_blocks=num_blocks * 2)
        disk.enqueue(hashes + [b"\xff" * 16], ids + [2 * num_blocks])
        disk.flush()
        t0 = time.perf_counter()
        assert disk.load(hashes, dst) == num_blocks
        sync(device)
        rows["disk_cached_ms"] = (time.perf_counter() - t0) * 1000 / num_blocks
        for name in os.listdir(d):
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            try:
                os.fsync(fd)  # only clean pages can be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        t0 = time.perf_counter()
        assert disk.load(hashes, dst) == num_blocks
        sync(device)
        rows["disk_cold_ms"] = (time.perf_counter() - t0) * 1000 / num_blocks
        disk.stop()
    for tier in ("host", "disk_cached", "disk_cold"):
        rows[f"{tier}_weight"] = max(0.0, 1 - rows[f"{tier}_ms"] / recompute)
    return rows


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def run(args: argparse.Namespace) -> int:
    if args.overlap:
        return tiers_overlap.run(args)
    rows = [measure(m, args.blocks, args.device) for m in args.models.split(",") if m]
    if args.json:
        print(json.dumps({"rows": rows}))
        return 0
    print(f"{'model':<13} {'block KiB':>9} {'recompute ms':>12} {'host ms':>8} {'disk ms':>8} {'cold ms':>8} "
          f"{'w host':>6} {'w disk':>6} {'w cold':>6}  (per block)")  # fmt: skip
    for r in rows:
        print(f"{r['model']:<13} {r['block_bytes'] / 1024:>9.0f} {r['recompute_ms']:>12.4f} {r['host_ms']:>8.4f} "
              f"{r['disk_cached_ms']:>8.4f} {r['disk_cold_ms']:>8.4f} {r['host_weight']:>6.2f} "
              f"{r['disk_cached_weight']:>6.2f} {r['disk_cold_weight']:>6.2f}", file=sys.stdout)  # fmt: skip
    return 0
