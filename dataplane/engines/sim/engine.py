"""SimEngine: kvplane's paged KV bookkeeping (the real block manager, prefix cache, scheduler and
KV events, dataplane/engines/paged) with a timing model where the forward pass would be.

It is a step machine with no clock and no thread of its own, so one class serves both drivers:
the agent's asyncio loop (adapter.py: sleeps each step's time, divided by the speedup) and the
discrete-event simulator (`kvplane sim`: advances a virtual clock by it).

    seconds = engine.begin_step()   # schedules the next step; None when nothing can run
    ... seconds later ...
    engine.end_step()               # its KV is written, tokens go to each request's sink

A step's time is timing.step_seconds(features of the scheduled chunks) (kvplane.hardware: a
roofline of the GPU and model, or a measured profile). With host or disk tiers (config host_gib,
disk_gib; tiers.py) a request's lower-tier hit is copied from its arrival, its prefill waits for
the copy's first layer, and its first prefill step lasts until the copy's last layer is in plus one
layer's compute, when that is longer (the step timing it reports stays the compute alone). Tokens are deterministic.
Greedy: each token is a function of the engine seed and a CRC-32 of every token before it, prompt
and generated alike, mixed by a step of a 64-bit LCG (Knuth's MMIX constants). So the same prompt
gives the same tokens on every sim worker of the same seed, and a request resumed from its prompt
plus the tokens it had sent (a migrated stream) goes on with the tokens the first run would have
made, as a real model's greedy decoding does. Temperature > 0: an LCG stream seeded from the
sampling seed or the engine's seeded stream. There is no EOS: a request ends at max_tokens or a
stop token, as with ignore_eos.
"""

from __future__ import annotations

import logging
import random
import struct
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvplane import hardware
from kvplane.block_hash import hash_blocks
from kvplane.dataplane.engines.base import EngineInfo
from kvplane.dataplane.engines.events import KVCacheEvent
from kvplane.dataplane.engines.paged.block_manager import BlockManager
from kvplane.dataplane.engines.paged.scheduler import RequestState, ScheduledChunk, Scheduler, step_features
from kvplane.dataplane.engines.request import EngineInputError, EngineLoad, EngineOutput, EngineRequest
from kvplane.dataplane.engines.sim.config import SimConfig
from kvplane.dataplane.engines.sim.pool import SimPool
from kvplane.dataplane.engines.sim.tiers import SimTiers, TierLoad
from kvplane.hardware import StepTiming
from kvplane.latency import StepSample
from kvplane.tokenizer import BYTE_TOKENIZER
from kvplane.types import BlockHash, Tier

if TYPE_CHECKING:
    from kvplane.dataplane.transport.modeled import ModeledLink

log = logging.getLogger(__name__)

Sink = Callable[[EngineOutput], None]

MAX_QUEUED_STEP_TIMINGS = 4096
_LCG_A, _LCG_C, _MASK64 = 6364136223846793005, 1442695040888963407, (1 << 64) - 1


class TokenStream:
    """A request's generated token ids: an LCG over 64 bits, the high bits mod the vocabulary."""

    __slots__ = ("state", "vocab_size")

    def __init__(self, seed: int, vocab_size: int) -> None:
        self.state = seed & _MASK64
        self.vocab_size = vocab_size

    def next(self) -> int:
        self.state = (self.state * _LCG_A + _LCG_C) & _MASK64
        return (self.state >> 33) % self.vocab_size


class GreedyStream:
    """Greedy tokens: each one a function of the sequence so far (its running CRC-32) and the seed."""

    __slots__ = ("digest", "seed", "vocab_size")

    def __init__(self, prompt_token_ids: Sequence[int], seed: int, vocab_size: int) -> None:
        self.digest = prompt_digest(prompt_token_ids)
        self.seed = seed & _MASK64
        self.vocab_size = vocab_size

    def next(self) -> int:
        state = ((self.digest ^ self.seed) * _LCG_A + _LCG_C) & _MASK64
        token = (state >> 33) % self.vocab_size
        self.digest = zlib.crc32(struct.pack("<I", token), self.digest)  # the CRC of the sequence with it
        return token


def prompt_digest(token_ids: Sequence[int]) -> int:
    return zlib.crc32(struct.pack(f"<{len(token_ids)}I", *token_ids))


class _CopyIn:
    """A lower-tier copy in virtual time (the scheduler's LoadHandle): its blocks count once the
    copy's first layer is in (the first prefill step is stretched for the rest: _stretch)."""

    __slots__ = ("num_blocks", "first_layer_at", "now")

    def __init__(self, num_blocks: int, first_layer_at: float, now) -> None:
        self.num_blocks, self.first_layer_at, self.now = num_blocks, first_layer_at, now

    def poll(self) -> int | None:
        return self.num_blocks if self.first_layer_at <= self.now() else None

    def cancel(self) -> None:  # nothing writes the simulated blocks: they may go back at once
        self.first_layer_at = 0.0


class SimEngine:
    def __init__(self, config: SimConfig, *, clock: Callable[[], float], timing: StepTiming | None = None) -> None:
        self.config = config.validate()
        spec = hardware.model(config.model)
        self.timing = timing if timing is not None else config.timing()
        self.model_name = spec.key
        self.layout = spec.layout(config.block_size)
        num_blocks = config.total_blocks()
        if num_blocks <= 0:
            raise ValueError(f"{config.model} on {config.tp} x {config.gpu} leaves no memory for KV blocks")
        self.pool = SimPool(self.layout, num_blocks, config.payload_bytes)
        self._clock = clock
        self._speedup = config.speedup  # the clock's seconds x speedup = simulated seconds
        self._num_layers = spec.num_layers
        self.tiers: SimTiers | None = None
        self._loads: dict[str, TierLoad] = {}  # request id -> its copy, started at arrival, until admission
        self._ready: dict[str, tuple[float, float]] = {}  # request id -> (first layer in, copy done) until its first step
        if config.host_gib:
            num_host = config.host_blocks()
            if num_host <= 0:
                raise ValueError(f"host_gib {config.host_gib} holds no KV block of {config.block_nbytes():,} bytes")
            self.tiers = SimTiers(
                num_host, config.disk_blocks(), config.block_nbytes(), spec.num_layers, config.host_load_bytes_per_s(),
                config.disk_load_bytes_per_s(),
            )  # fmt: skip
        tiered = self.tiers is not None
        self._blocks = BlockManager(num_blocks, on_stored=self._stored if tiered else self.pool.write)
        self._scheduler = Scheduler(
            self._blocks, self.model_name, config.block_size, config.max_num_seqs, config.max_num_batched_tokens, (), clock=clock,
            start_load=self._load_lower if tiered else None,
        )  # fmt: skip
        self.info = EngineInfo(
            model=self.model_name,
            layout=self.layout,
            max_context=spec.max_context,
            vocab_size=spec.vocab_size,
            max_tokens_limit=config.max_tokens_limit,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            tokenizer=BYTE_TOKENIZER,  # the control plane tokenizes text as UTF-8 bytes
            hardware=config.hardware_label(),
            link_gb_per_s=hardware.link(config.link).bits_per_s / 8e9,
        )
        self.modeled_link: ModeledLink | None = None  # set by the agent's adapter (KVImportExport)
        self._seed_stream = random.Random(config.seed)
        self._step: list[ScheduledChunk] = []  # the step in flight
        self._step_timings: deque[StepSample] = deque(maxlen=MAX_QUEUED_STEP_TIMINGS)
        self._live: dict[str, RequestState] = {}
        self._abort_ids: set[str] = set()
        self.stopped = False
        self.last_features: tuple[int, int, int, int] = (0, 0, 0, 0)  # of the latest step begun

    # --- requests --------------------------------------------------------------------------
    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Queues a request (EngineInputError / EngineCapacityError when it can never run)."""
        if self.stopped:
            raise RuntimeError("the sim engine is stopped and accepts no requests")
        info = self.info
        self._scheduler.validate(request, vocab_size=info.vocab_size, max_tokens_limit=info.max_tokens_limit, max_context=info.max_context)
        if request.request_id in self._live:
            raise EngineInputError(f"request_id {request.request_id!r} is already in flight")
        params, engine_seed = request.sampling, self.config.seed * _LCG_A
        if params.temperature > 0:
            seed = params.seed if params.seed is not None else self._seed_stream.getrandbits(63)
            generator: TokenStream | GreedyStream = TokenStream(seed ^ engine_seed, info.vocab_size)
        else:
            generator = GreedyStream(request.prompt_token_ids, engine_seed, info.vocab_size)
        seq = RequestState(
            request=request,
            sink=sink,
            generator=generator,
            token_ids=list(request.prompt_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
            held_block_ids=list(request.held_block_ids),
        )
        self._live[request.request_id] = seq
        if self.tiers is not None:
            self._start_load(seq)
        self._scheduler.enqueue(seq)

    def abort(self, request_id: str) -> None:
        """Ends a queued or running request before the next step (its sink gets "abort")."""
        if request_id in self._live:
            self._abort_ids.add(request_id)

    def stop(self) -> None:
        """Aborts every request; the engine takes no more."""
        self.stopped = True
        self._step = []
        for seq in list(self._live.values()):
            self._end(seq, "abort")

    # --- stepping ----------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self._step)

    @property
    def has_work(self) -> bool:
        return bool(self._live)

    def begin_step(self) -> float | None:
        """Schedules the next step and returns its simulated seconds; None when nothing can run."""
        if self._step:
            raise RuntimeError("a step is already in flight; end_step() first")
        for request_id in sorted(self._abort_ids):
            seq = self._live.get(request_id)
            if seq is not None:
                self._end(seq, "abort")
        self._abort_ids.clear()
        if self.stopped:
            return None
        chunks = self._scheduler.schedule()
        if not chunks:
            return None
        self._step = chunks
        features = self.last_features = step_features(chunks)
        seconds = self.timing.step_seconds(*features)
        # The compute alone: what a step-time model fitted from these samples should predict.
        self._step_timings.append(StepSample(*features, seconds=seconds))
        if self._ready:
            seconds = self._stretch(chunks, seconds)
        return seconds

    def end_step(self) -> None:
        """The step's KV is written: account its chunks and send what they produced."""
        chunks, self._step = self._step, []
        outputs: list[tuple[Sink, EngineOutput]] = []
        for chunk in chunks:
            seq = chunk.seq
            due = chunk.completes_known_tokens and not seq.request.prefill_only
            out = self._scheduler.update(chunk, seq.generator.next() if due else None)
            if out is not None:
                outputs.append((seq.sink, out))
                if out.finished:
                    self._live.pop(seq.request_id, None)
        for sink, out in outputs:
            sink(out)

    def _end(self, seq: RequestState, reason: str) -> None:
        self._scheduler.remove(seq)
        self._live.pop(seq.request_id, None)
        load = self._loads.pop(seq.request_id, None)
        if load is not None and self.tiers is not None:
            self.tiers.end_load(load)
        self._ready.pop(seq.request_id, None)
        seq.sink(seq.output([], reason))

    # --- lower tiers (tiers.py) --------------------------------------------------------------
    def _now(self) -> float:
        return self._clock() * self._speedup

    def _stored(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        self.pool.write(block_hashes, block_ids)
        assert self.tiers is not None
        self.tiers.offload(self._now(), block_hashes)

    def _start_load(self, seq: RequestState) -> None:
        """At arrival: copy the blocks after the device-cached prefix that a lower tier holds."""
        assert self.tiers is not None
        bs = self.config.block_size
        seq.block_hashes = self.prompt_block_hashes(seq.token_ids[: seq.num_prompt_tokens], seq.request.cache_salt)
        max_hit = (seq.num_prompt_tokens - 1) // bs
        on_device = len(self._blocks.longest_cached_prefix(seq.block_hashes[:max_hit]))
        if on_device < max_hit:
            load = self.tiers.start_load(self._now(), seq.block_hashes[on_device:max_hit])
            if load is not None:
                self._loads[seq.request_id] = load

    def _load_lower(self, seq: RequestState, block_hashes: list[BlockHash], block_ids: list[int]) -> _CopyIn | None:
        """At admission (the scheduler's start_load): the leading block_hashes the tiers hold,
        in once the copy's first layer is (the scheduler admits the request to the batch then).
        Blocks the arrival's copy did not cover (the device lost them while the request waited)
        are copied now."""
        tiers = self.tiers
        assert tiers is not None
        now = self._now()
        load = self._loads.pop(seq.request_id, None)
        covered = set(load.block_hashes) if load is not None else set()
        tiers.advance(now)
        run = []
        for h in block_hashes:
            if h not in covered and not tiers.holds(h):
                break
            run.append(h)
        loads = [load] if load is not None else []
        extra = [h for h in run if h not in covered]
        if extra:
            more = tiers.start_load(now, extra)  # all held (checked just now, nothing committed since)
            assert more is not None and len(more.block_hashes) == len(extra)
            loads.append(more)
        used = set(run)
        num_disk = sum(1 for one in loads for h in one.disk_block_hashes if h in used)
        first = max((one.first_layer_at for one in loads), default=0.0)
        done = max((one.done_at for one in loads), default=0.0)
        for one in loads:
            tiers.end_load(one)  # registered on the device next: no lower copy is needed any more
        if not run:
            return None
        if done > now:
            self._ready[seq.request_id] = (first, done)
        seq.num_disk_loaded_tokens = num_disk * self.config.block_size
        return _CopyIn(len(run), first, self._now)

    def _stretch(self, chunks: list[ScheduledChunk], seconds: float) -> float:
        """A request's first prefill step lasts until its copy's last layer is in plus one
        layer's compute, when that is longer (the module docstring)."""
        now = self._now()
        for chunk in chunks:
            ready = self._ready.pop(chunk.seq.request_id, None)
            if ready is not None:
                seconds = max(seconds, ready[1] - now + seconds / self._num_layers)
        return seconds

    def next_ready_at(self) -> float | None:
        """When (in the clock's seconds) the next request waiting for a copy's first layer may
        prefill; None when none waits. A driver that found no step to run wakes then."""
        now = self._now()
        pending = [first for first, _ in self._ready.values() if first > now]
        return min(pending) / self._speedup if pending else None

    # --- introspection -----------------------------------------------------------------------
    def load(self) -> EngineLoad:
        return self._scheduler.load()

    def take_step_timings(self) -> list[StepSample]:
        """The steps scheduled since the last call, in simulated seconds."""
        timings = list(self._step_timings)
        self._step_timings.clear()
        return timings

    def take_kv_events(self) -> list[KVCacheEvent]:
        events = self._blocks.take_events()
        if self.tiers is not None:
            events += self.tiers.take_events(self._now())
        return events

    def cached_block_hashes_by_tier(self) -> dict[Tier, list[BlockHash]]:
        out = {Tier.DEVICE: self._blocks.cached_block_hashes()}
        if self.tiers is not None:
            out.update(self.tiers.hashes_by_tier(self._now()))
        return out

    # --- KV import / export (KVImportExport) -------------------------------------------------
    def prompt_block_hashes(self, prompt_token_ids: Sequence[int], cache_salt: str = "") -> list[BlockHash]:
        return hash_blocks(prompt_token_ids, self.config.block_size, self.model_name, cache_salt)

    def pin_cached_prefix(self, prompt_token_ids: Sequence[int], cache_salt: str = "") -> tuple[list[BlockHash], list[int]]:
        hashes = self.prompt_block_hashes(prompt_token_ids, cache_salt)
        block_ids = self._blocks.pin_prefix(hashes)
        return hashes[: len(block_ids)], block_ids

    def missing_blocks(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        return self._blocks.missing(block_hashes)

    def allocate_for_import(self, num_blocks: int) -> list[int] | None:
        return self._blocks.allocate(num_blocks)

    def commit_import(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> list[int]:
        """Registers pulled blocks after checking each holds its hash's fingerprint; a corrupt
        block frees the whole import and raises ValueError: corrupt KV must never be cached."""
        bad = self.pool.corrupt(block_hashes, block_ids)
        if bad:
            self.abort_import(block_ids)
            raise ValueError(f"{len(bad)} pulled KV blocks do not hold the blocks asked for (first: index {bad[0]})")
        return self._blocks.commit_import(block_hashes, block_ids)

    def abort_import(self, block_ids: Sequence[int]) -> None:
        self._blocks.release(list(block_ids)[::-1])

    def unpin(self, block_ids: Sequence[int]) -> None:
        self._blocks.release(list(block_ids)[::-1])
