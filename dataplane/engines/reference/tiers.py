"""Lower KV tiers under the device pool: a host-memory pool and an optional disk directory.

Rule (write-through to host, spill to disk; after SGLang HiCache's `write_through` policy and
vLLM's CPU KV offloading): every block registered in the device prefix cache is queued for a copy
into the host pool, made by a background thread, so a device eviction loses nothing the host does
not already hold. The host pool is LRU over `num_host_blocks` (inclusive of the device pool, so it
should be larger); a block the host evicts moves down to the disk tier when one is configured: one
file per block named by its hash, written under a temporary name and renamed, so a crash never
leaves a torn block; the disk tier is LRU over `num_disk_blocks`. A device-pool miss is looked up
here: the longest run of following blocks held on host or disk is copied into fresh device blocks
before the request's prefill continues. Every move queues a KV event naming the tier, so the
control plane's index follows the blocks. The disk directory is rescanned at startup (its
`layout.json` must match), so disk blocks outlive the process.

Loads are off the engine step: start_load() queues a TierLoad for the copy thread (which serves
loads before offloads: a request waits on a load, nobody waits on an offload) and returns at once;
the scheduler lets the request into the batch when the load reports done, and `on_load_done` wakes
the engine. On CUDA the copy thread issues its copies on its own stream, from pinned host memory,
and synchronises that stream before reporting (untested here: no GPU). `sync_loads` keeps the old
path, the copy inside start_load on the engine's step thread, as a baseline for `kvplane bench
tiers --overlap`. `host_load_gbs` caps host -> device copies at that rate (0 = as fast as the
copy runs), so a CPU-only machine can model a PCIe link whose copies take time.

Consistency without the engine lock: the copy thread reads a device block while the engine runs
and keeps the copy only if the block was not handed out again meanwhile (a per-block generation
counter kept by the block manager, checked after the copy, like a seqlock). Only the copy thread
writes host slots or removes disk files by eviction, so it reads a host slot or file outside this
store's lock; the synchronous path holds the lock for its whole copy instead. A load writes only
blocks its request owns, which the scheduler frees after the load reports done. Lock order:
engine lock, then this store's lock; the copy thread takes the engine lock (in on_load_done) only
while it holds nothing else.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from kvplane.dataplane.engines.events import BlockRemoved, BlockStored, KVCacheEvent
from kvplane.dataplane.engines.reference.kv_pool import TORCH_DTYPES, KVPool
from kvplane.types import BlockHash, KVLayout, Tier

log = logging.getLogger(__name__)

BLOCK_SUFFIX = ".kv"
LAYOUT_FILE = "layout.json"


@dataclass(slots=True)
class TierStats:
    num_host_blocks: int = 0  # held now
    num_disk_blocks: int = 0  # held now
    num_offloaded_to_host: int = 0  # copies made device -> host
    num_spilled_to_disk: int = 0  # blocks moved host -> disk
    num_loaded_from_host: int = 0  # blocks copied back host -> device
    num_loaded_from_disk: int = 0  # blocks read back disk -> device
    num_dropped: int = 0  # offloads skipped: the device block was reused before the copy


@dataclass(slots=True, eq=False)
class TierLoad:
    """One request's load from the lower tiers (the scheduler's LoadHandle). The copy thread sets
    num_loaded, then done; the engine reads them."""

    block_hashes: list[BlockHash]
    block_ids: list[int]
    num_loaded: int = 0
    done: bool = False
    cancelled: bool = False

    def poll(self) -> int | None:
        return self.num_loaded if self.done else None

    def cancel(self) -> None:
        self.cancelled = True


class TierStore:
    def __init__(
        self,
        pool: KVPool,
        num_host_blocks: int,
        generation: Callable[[int], int],
        disk_dir: str | os.PathLike[str] | None = None,
        num_disk_blocks: int = 0,
        *,
        on_load_done: Callable[[], None] = lambda: None,
        sync_loads: bool = False,
        host_load_gbs: float = 0.0,
    ) -> None:
        if num_host_blocks <= 0:
            raise ValueError(f"num_host_blocks must be positive, got {num_host_blocks}")
        if not host_load_gbs >= 0:
            raise ValueError(f"host_load_gbs must be >= 0, got {host_load_gbs}")
        self._pool = pool
        self._generation = generation
        self._on_load_done = on_load_done
        self._sync_loads = sync_loads
        self._host_load_bytes_per_s = host_load_gbs * 1e9
        # The copy thread's own CUDA stream, so its copies overlap the step's kernels.
        self._stream = torch.cuda.Stream(pool.device) if pool.device.type == "cuda" else None
        shape = tuple(pool.buffer.shape[1:])
        # Pinned memory makes host <-> device copies asynchronous DMA on CUDA.
        pin = pool.device.type == "cuda"
        self._host = torch.zeros((num_host_blocks, *shape), dtype=pool.buffer.dtype, pin_memory=pin)
        self._host_lru: OrderedDict[BlockHash, int] = OrderedDict()  # hash -> slot, oldest first
        self._host_free = list(range(num_host_blocks - 1, -1, -1))
        self._disk_dir = Path(disk_dir) if disk_dir else None
        self._num_disk_blocks = num_disk_blocks
        self._disk_lru: OrderedDict[BlockHash, None] = OrderedDict()
        self._events: list[KVCacheEvent] = []
        self.stats = TierStats()
        # Re-entrant: the synchronous load holds it around the per-block steps the copy thread shares.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[tuple[BlockHash, int, int]] = deque()
        self._loads: deque[TierLoad] = deque()
        self._busy = False
        self._stopping = False
        if self._disk_dir is not None:
            if num_disk_blocks <= 0:
                raise ValueError(f"num_disk_blocks must be positive with a disk tier, got {num_disk_blocks}")
            self._open_disk(pool.layout)
        self._thread = threading.Thread(target=self._run, name="kv-copy", daemon=True)
        self._thread.start()

    # --- engine side (called under the engine lock) --------------------------------------------
    def enqueue(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        """Queues newly registered device blocks for a copy to the host pool."""
        with self._cond:
            for h, b in zip(block_hashes, block_ids):
                self._queue.append((h, b, self._generation(b)))
            self._cond.notify_all()

    def start_load(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> TierLoad | None:
        """Starts copying the longest leading run of block_hashes held on host or disk into the
        device blocks block_ids (same order); None when the first is on neither. With sync_loads
        the copy is done before this returns."""
        with self._cond:
            if not block_hashes or (block_hashes[0] not in self._host_lru and block_hashes[0] not in self._disk_lru):
                return None
            load = TierLoad(list(block_hashes), list(block_ids))
            if self._sync_loads:
                load.num_loaded, load.done = self.load(block_hashes, block_ids), True
            else:
                self._loads.append(load)
                self._cond.notify_all()
            return load

    def load(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> int:
        """The copy of start_load on the caller's thread (the in-step baseline; `bench tiers`);
        returns how many blocks were loaded."""
        with self._lock:  # held throughout: the copy thread may reuse a host slot once it is released
            return self._copy_in(block_hashes, block_ids)

    def _copy_in(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int], load: TierLoad | None = None) -> int:
        loaded = 0
        started = time.perf_counter()
        num_host_bytes = 0
        for h, b in zip(block_hashes, block_ids):
            if load is not None and load.cancelled:
                break
            with self._lock:
                slot = self._host_lru.get(h)
                if slot is not None:
                    self._host_lru.move_to_end(h)
                elif h not in self._disk_lru:
                    break
            if slot is not None:
                self._load_block(self._host[slot], b)
                num_host_bytes += self._pool.block_nbytes
                self._pace(started, num_host_bytes)
                with self._lock:
                    self.stats.num_loaded_from_host += 1
            elif self._read_disk(h, b):
                with self._lock:
                    if h in self._disk_lru:
                        self._disk_lru.move_to_end(h)
                    self.stats.num_loaded_from_disk += 1
            else:
                break
            loaded += 1
        return loaded

    def _load_block(self, src: torch.Tensor, block_id: int) -> None:
        """One block host -> device (async on the copy stream; the load synchronises it at the end)."""
        dst = self._pool.buffer[block_id]
        if self._stream is None:
            # On CPU a plain memcpy: one thread, GIL released, where torch's copy_ would start an
            # OpenMP team that fights the step's own for the cores.
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), self._pool.block_nbytes)
        else:
            dst.copy_(src, non_blocking=True)

    def _pace(self, started: float, num_bytes: int) -> None:
        """Sleeps until num_bytes would have crossed a host_load_gbs link since started."""
        if self._host_load_bytes_per_s > 0:
            left = started + num_bytes / self._host_load_bytes_per_s - time.perf_counter()
            if left > 0:
                time.sleep(left)

    def hashes_by_tier(self) -> dict[Tier, list[BlockHash]]:
        with self._lock:
            return {Tier.HOST: list(self._host_lru), Tier.DISK: list(self._disk_lru)}

    def take_events(self) -> list[KVCacheEvent]:
        with self._lock:
            events, self._events = self._events, []
            return events

    def snapshot_stats(self) -> TierStats:
        with self._lock:
            self.stats.num_host_blocks = len(self._host_lru)
            self.stats.num_disk_blocks = len(self._disk_lru)
            return TierStats(**asdict(self.stats))

    def clear(self) -> None:
        """Forgets every host and disk block (the engine emits the cleared event)."""
        with self._lock:
            self._queue.clear()
            self._host_free = list(range(self._host.shape[0] - 1, -1, -1))
            self._host_lru.clear()
            for h in list(self._disk_lru):
                self._block_path(h).unlink(missing_ok=True)
            self._disk_lru.clear()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Waits until every queued load and offload is done (tests, benchmarks, orderly shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._loads or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    # --- the copy thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            load, batch = None, []
            with self._cond:
                while not self._queue and not self._loads and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    break
                if self._loads:
                    load = self._loads.popleft()
                else:
                    batch = [item for item in self._queue if item[0] not in self._host_lru]
                    for h, _, _ in self._queue:
                        if h in self._host_lru:
                            self._host_lru.move_to_end(h)
                    self._queue.clear()
                self._busy = True
            try:
                if load is not None:
                    self._run_load(load)
                elif batch:
                    self._on_copy_stream(self._offload, batch)
            except Exception:  # a failed offload loses a cached block, never a request
                log.exception("offloading %d KV blocks to the host tier failed", len(batch))
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        with self._cond:  # stopped: loads never started report nothing loaded
            stranded, self._loads = list(self._loads), deque()
            for load in stranded:
                load.done = True
        if stranded:
            self._on_load_done()

    def _run_load(self, load: TierLoad) -> None:
        num_loaded = 0
        try:
            num_loaded = self._on_copy_stream(self._copy_in, load.block_hashes, load.block_ids, load)
        except Exception:  # the request computes what was not loaded
            log.exception("loading %d KV blocks from the lower tiers failed", len(load.block_ids))
        finally:
            with self._lock:
                load.num_loaded, load.done = num_loaded, True
            self._on_load_done()

    def _on_copy_stream(self, copy: Callable[..., Any], *args: Any) -> Any:
        """Runs copy on this thread's CUDA stream and waits for its copies; plainly on CPU."""
        if self._stream is None:
            return copy(*args)
        with torch.cuda.stream(self._stream):
            result = copy(*args)
        self._stream.synchronize()
        return result

    def _offload(self, batch: list[tuple[BlockHash, int, int]]) -> None:
        ids = torch.tensor([b for _, b, _ in batch], dtype=torch.long, device=self._pool.device)
        staged = self._pool.buffer.index_select(0, ids).to("cpu")
        # Only copies of blocks nobody reallocated during the copy are valid.
        valid = [i for i, (_, b, gen) in enumerate(batch) if self._generation(b) == gen]
        spilled: list[tuple[BlockHash, torch.Tensor]] = []
        with self._lock:
            self.stats.num_dropped += len(batch) - len(valid)
            stored: list[BlockHash] = []
            removed: list[BlockHash] = []
            for i in valid:
                h = batch[i][0]
                if h in self._host_lru:
                    continue
                if not self._host_free:
                    victim, slot = self._host_lru.popitem(last=False)
                    removed.append(victim)
                    if self._disk_dir is not None:
                        spilled.append((victim, self._host[slot].clone()))
                    self._host_free.append(slot)
                slot = self._host_free.pop()
                self._host[slot].copy_(staged[i])
                self._host_lru[h] = slot
                stored.append(h)
            self.stats.num_offloaded_to_host += len(stored)
            if removed:
                self._events.append(BlockRemoved(tuple(removed), Tier.HOST))
            if stored:
                self._events.append(BlockStored(tuple(stored), Tier.HOST))
        if spilled:
            self._spill(spilled)

    def _spill(self, blocks: list[tuple[BlockHash, torch.Tensor]]) -> None:
        written: list[BlockHash] = []
        for h, data in blocks:
            if h in self._disk_lru:
                written.append(h)
                continue
            path = self._block_path(h)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                f.write(data.contiguous().view(torch.uint8).numpy().tobytes())
            os.replace(tmp, path)  # atomic: readers see the whole block or no file
            written.append(h)
        with self._lock:
            stored = []
            for h in written:
                if h in self._disk_lru:
                    self._disk_lru.move_to_end(h)
                else:
                    self._disk_lru[h] = None
                    stored.append(h)
            self.stats.num_spilled_to_disk += len(stored)
            removed = []
            while len(self._disk_lru) > self._num_disk_blocks:
                victim, _ = self._disk_lru.popitem(last=False)
                self._block_path(victim).unlink(missing_ok=True)
                removed.append(victim)
            if stored:
                self._events.append(BlockStored(tuple(stored), Tier.DISK))
            if removed:
                self._events.append(BlockRemoved(tuple(removed), Tier.DISK))

    # --- disk ---------------------------------------------------------------------------------
    def _block_path(self, h: BlockHash) -> Path:
        assert self._disk_dir is not None
        return self._disk_dir / f"{h.hex()}{BLOCK_SUFFIX}"

    def _read_disk(self, h: BlockHash, block_id: int) -> bool:
        try:
            raw = self._block_path(h).read_bytes()
        except OSError:
            raw = b""
        if len(raw) != self._pool.block_nbytes:
            with self._lock:  # a clear() may have dropped it meanwhile
                if self._disk_lru.pop(h, False) is None:
                    log.warning("disk KV block %s is missing or truncated; dropping it", h.hex())
                    self._events.append(BlockRemoved((h,), Tier.DISK))
            return False
        data = torch.frombuffer(bytearray(raw), dtype=TORCH_DTYPES[self._pool.layout.dtype])
        self._pool.buffer[block_id].copy_(data.view(self._pool.buffer.shape[1:]))
        return True

    def _open_disk(self, layout: KVLayout) -> None:
        """Creates or reopens the directory; known blocks are listed oldest first (by mtime)."""
        assert self._disk_dir is not None
        self._disk_dir.mkdir(parents=True, exist_ok=True)
        marker = self._disk_dir / LAYOUT_FILE
        if marker.exists():
            found = KVLayout(**json.loads(marker.read_text()))
            mismatch = layout.mismatch(found)
            if mismatch:
                raise ValueError(f"disk KV tier {self._disk_dir} holds blocks of another layout ({mismatch}); use another directory")
        else:
            marker.write_text(json.dumps(asdict(layout)))
        entries = []
        for path in self._disk_dir.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # a write cut short by a crash
            elif path.name.endswith(BLOCK_SUFFIX):
                try:
                    h = BlockHash(bytes.fromhex(path.name[: -len(BLOCK_SUFFIX)]))
                    stat = path.stat()
                except (ValueError, OSError):
                    continue
                if stat.st_size == layout.block_nbytes:
                    entries.append((stat.st_mtime, h))
        entries.sort()
        for _, h in entries[max(0, len(entries) - self._num_disk_blocks) :]:
            self._disk_lru[h] = None
        for _, h in entries[: max(0, len(entries) - self._num_disk_blocks)]:
            self._block_path(h).unlink(missing_ok=True)
        if entries:
            log.info("disk KV tier %s: %d blocks from a previous run", self._disk_dir, len(self._disk_lru))
