"""SimTiers: host memory and a local NVMe drive under the sim engine's device pool, in virtual time.

Rule (the reference engine's write-through, dataplane/engines/reference/tiers.py; after SGLang
HiCache's `write_through` and vLLM's CPU offloading), with the time every copy takes:
- Write-through: every block registered on the device is copied to host. It is held on host (and
  its stored event, tier HOST, is queued) once its copy ends. The copy is issued on the device's
  stream when the step that wrote the block ends, so any later reuse of the block is ordered
  after it: no copy is lost to a reuse (the reference engine, copying from a thread, checks a
  generation instead). The host tier is LRU
  over `num_host_blocks`; a block it evicts is written to disk when there is a disk tier (held
  there, tier DISK, once the write ends), which is LRU over `num_disk_blocks`.
- The copy engine is its own resource beside compute: each direction of the worker's PCIe links
  (device -> host for offloads, host -> device for loads: full duplex) and the drive (reads and
  spill writes share it) is busy until some virtual time; copies queue on them first come first
  served, and never slow a step down by themselves.
- Loads start when a request reaches the worker (`start_load`, from the engine's submit): the
  blocks right after its device-cached prefix that host (then disk) holds, in prefix order, are
  pinned (no eviction while they move) and copied. The copy is layer-major for host blocks (the
  first layer of every block arrives after 1 / num_layers of the copy), whole blocks for disk
  blocks (a file per block, as the reference engine stores them: none of a disk block is usable
  before its read ends). So a load has `first_layer_at` and `done_at`.
- Layer by layer, modelled simply: the request's prefill may start once the first layer is in
  (`first_layer_at`); its first prefill step, of S seconds at S / num_layers per layer, then ends
  at max(start + S, done_at + S / num_layers): later layers are copied while earlier layers are
  computed, and only what the step does not hide stretches it (and the batch riding in it, as
  layer-wise loading stalls a real forward pass). A request queued behind others whose load ends
  before its turn pays nothing.
- At admission the loaded blocks are registered on the device (the scheduler's `start_load`);
  blocks a tier holds that the arrival-time load did not cover (the device evicted them while the
  request waited) are loaded then, from the admission time.
Everything happens lazily at the calls (`advance(now)` commits the copies that have ended), so
the tier needs no clock or thread of its own.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvplane.dataplane.engines.events import BlockRemoved, BlockStored, KVCacheEvent
from kvplane.types import BlockHash, Tier


@dataclass(slots=True)
class TierLoad:
    """One request's copy from the lower tiers, in virtual seconds."""

    block_hashes: list[BlockHash]  # in prefix order
    disk_block_hashes: frozenset[BlockHash]  # of them, those read from disk
    first_layer_at: float
    done_at: float


@dataclass(slots=True)
class SimTierStats:
    num_offloaded_to_host: int = 0
    num_spilled_to_disk: int = 0
    num_loaded_from_host: int = 0
    num_loaded_from_disk: int = 0


class SimTiers:
    def __init__(
        self,
        num_host_blocks: int,
        num_disk_blocks: int,
        block_nbytes: int,
        num_layers: int,
        host_bytes_per_s: float,
        disk_bytes_per_s: float,
    ) -> None:
        if num_host_blocks <= 0 or num_disk_blocks < 0:
            raise ValueError(f"the tiers need num_host_blocks > 0 and num_disk_blocks >= 0, got {num_host_blocks}, {num_disk_blocks}")
        self.num_host_blocks = num_host_blocks
        self.num_disk_blocks = num_disk_blocks
        self._host_s = block_nbytes / host_bytes_per_s  # seconds per block over PCIe, one direction
        self._disk_s = block_nbytes / disk_bytes_per_s
        self._num_layers = num_layers
        self._host: OrderedDict[BlockHash, None] = OrderedDict()  # least recently used first
        self._disk: OrderedDict[BlockHash, None] = OrderedDict()
        self._pins: dict[BlockHash, int] = {}  # blocks a started load is copying
        self._d2h_free = self._h2d_free = self._drive_free = 0.0
        # Copies in flight, each FIFO on its resource, so their end times never decrease.
        self._offloads: deque[tuple[float, list[BlockHash]]] = deque()
        self._spills: deque[tuple[float, list[BlockHash]]] = deque()
        self._events: list[KVCacheEvent] = []
        self.stats = SimTierStats()

    # --- write-through ------------------------------------------------------------------------
    def offload(self, now: float, block_hashes: Sequence[BlockHash]) -> None:
        """Newly registered device blocks start their copy to host (those it holds are touched)."""
        self.advance(now)
        hashes = []
        for h in block_hashes:
            if h in self._host:
                self._host.move_to_end(h)
            else:
                hashes.append(h)
        if not hashes:
            return
        self._d2h_free = max(now, self._d2h_free) + len(hashes) * self._host_s
        self._offloads.append((self._d2h_free, hashes))

    def advance(self, now: float) -> None:
        """Commits every copy that has ended by `now`, in the order they end."""
        while self._offloads or self._spills:
            t_off = self._offloads[0][0] if self._offloads else float("inf")
            t_spill = self._spills[0][0] if self._spills else float("inf")
            if min(t_off, t_spill) > now:
                return
            if t_off <= t_spill:
                self._commit_offload(*self._offloads.popleft())
            else:
                self._commit_spill(*self._spills.popleft())

    def _commit_offload(self, done_at: float, hashes: list[BlockHash]) -> None:
        stored: list[BlockHash] = []
        for h in hashes:
            if h in self._host:
                self._host.move_to_end(h)
            else:
                self._host[h] = None
                stored.append(h)
        if not stored:
            return
        self.stats.num_offloaded_to_host += len(stored)
        self._events.append(BlockStored(tuple(stored), Tier.HOST))
        victims = _evict(self._host, self.num_host_blocks, self._pins)
        if victims:
            self._events.append(BlockRemoved(tuple(victims), Tier.HOST))
            spill = [h for h in victims if h not in self._disk] if self.num_disk_blocks else []
            for h in victims:
                if h in self._disk:
                    self._disk.move_to_end(h)
            if spill:
                self._drive_free = max(done_at, self._drive_free) + len(spill) * self._disk_s
                self._spills.append((self._drive_free, spill))

    def _commit_spill(self, _done_at: float, hashes: list[BlockHash]) -> None:
        stored = [h for h in hashes if h not in self._disk]
        for h in stored:
            self._disk[h] = None
        self.stats.num_spilled_to_disk += len(stored)
        if stored:
            self._events.append(BlockStored(tuple(stored), Tier.DISK))
        victims = _evict(self._disk, self.num_disk_blocks, self._pins)
        if victims:
            self._events.append(BlockRemoved(tuple(victims), Tier.DISK))

    # --- loads --------------------------------------------------------------------------------
    def holds(self, h: BlockHash) -> bool:
        return h in self._host or h in self._disk

    def start_load(self, now: float, block_hashes: Sequence[BlockHash]) -> TierLoad | None:
        """Pins and starts copying the longest leading run of block_hashes held on host or disk;
        None when the first is on neither."""
        self.advance(now)
        run: list[BlockHash] = []
        from_disk: list[BlockHash] = []
        for h in block_hashes:
            if h in self._host:
                self._host.move_to_end(h)
            elif h in self._disk:
                self._disk.move_to_end(h)
                from_disk.append(h)
            else:
                break
            run.append(h)
        num_disk = len(from_disk)
        if not run:
            return None
        for h in run:
            self._pins[h] = self._pins.get(h, 0) + 1
        # Disk blocks come up through host memory: the drive reads them while the PCIe link copies.
        h2d_start = max(now, self._h2d_free)
        self._h2d_free = h2d_start + len(run) * self._host_s
        first_layer_at = h2d_start + (len(run) - num_disk) * self._host_s / self._num_layers
        done_at = self._h2d_free
        if num_disk:
            self._drive_free = max(now, self._drive_free) + num_disk * self._disk_s
            first_layer_at = max(first_layer_at, self._drive_free)
            done_at = max(done_at, self._drive_free + self._host_s)
        self.stats.num_loaded_from_host += len(run) - num_disk
        self.stats.num_loaded_from_disk += num_disk
        return TierLoad(run, frozenset(from_disk), first_layer_at, done_at)

    def end_load(self, load: TierLoad) -> None:
        """The load's blocks are on the device (or its request ended): unpin them."""
        for h in load.block_hashes:
            n = self._pins[h] - 1
            if n:
                self._pins[h] = n
            else:
                del self._pins[h]

    # --- introspection ------------------------------------------------------------------------
    def take_events(self, now: float) -> list[KVCacheEvent]:
        self.advance(now)
        events, self._events = self._events, []
        return events

    def hashes_by_tier(self, now: float) -> dict[Tier, list[BlockHash]]:
        self.advance(now)
        return {Tier.HOST: list(self._host), Tier.DISK: list(self._disk)}


def _evict(lru: OrderedDict[BlockHash, None], capacity: int, pins: dict[BlockHash, int]) -> list[BlockHash]:
    """Drops least recently used blocks that no load is copying until `lru` fits `capacity` (a
    pinned block at the front is moved to the back: a load is using it)."""
    victims: list[BlockHash] = []
    tries = len(lru)
    while len(lru) > capacity and tries > 0:
        tries -= 1
        h, _ = lru.popitem(last=False)
        if h in pins:
            lru[h] = None
        else:
            victims.append(h)
    return victims
