"""Engine: the reference engine's public API and its background step thread.

submit() validates on the caller's thread and queues; the step thread admits, runs one batched
model call per step (decodes plus prompt chunks), samples, and hands outputs to each request's
sink. The block manager and queues are guarded by one lock, released during the model call: the
call only touches blocks the running requests hold, so imports and lookups proceed meanwhile.
A prefix found in the host or disk tier is copied by the tiers' copy thread, started at
admission; the request joins the batch when its blocks are in (paged/scheduler.py), so no step
waits for the copy.
Each step's wall time (model call and sampling) is queued with its features (kvplane.latency)
for take_step_timings(), from which the agent fits its step-time model.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from kvplane.block_hash import hash_blocks
from kvplane.dataplane.engines.events import KVCacheEvent
from kvplane.dataplane.engines.paged.block_manager import BlockManager
from kvplane.dataplane.engines.paged.scheduler import RequestState, ScheduledChunk, Scheduler, step_features
from kvplane.dataplane.engines.reference.config import EngineConfig
from kvplane.dataplane.engines.reference.kv_pool import KVPool
from kvplane.dataplane.engines.reference.runner import ChunkResult, ModelRunner
from kvplane.dataplane.engines.reference.sampling import make_generator
from kvplane.dataplane.engines.reference.tiers import TierStats, TierStore
from kvplane.dataplane.engines.reference.weights import load_model
from kvplane.dataplane.engines.request import (
    EngineInputError,
    EngineLoad,
    EngineOutput,
    EngineRequest,
)
from kvplane.latency import StepSample
from kvplane.sampling import is_greedy
from kvplane.types import BlockHash, KVLayout, Tier

log = logging.getLogger(__name__)

Sink = Callable[[EngineOutput], None]

MAX_QUEUED_STEP_TIMINGS = 4096  # untaken timings beyond this drop the oldest


class Engine:
    modeled_link = None  # KVImportExport: the pool holds the real KV

    def __init__(self, config: EngineConfig) -> None:
        self.config = config.validate()
        loaded = load_model(config)
        self.model_name = loaded.name
        self.tokenizer = loaded.tokenizer
        self.model = loaded.model
        cfg = loaded.config
        self.vocab_size = cfg.vocab_size
        self.max_context = cfg.max_position_embeddings
        self.max_tokens_limit = config.max_tokens_limit
        self.eos_token_ids = cfg.eos_token_ids
        self.layout = KVLayout(
            model=self.model_name,
            num_layers=cfg.num_hidden_layers,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            dtype=config.dtype,
            block_size=config.block_size,
        )
        self.pool = KVPool(self.layout, config.num_blocks, device=config.device)
        self._cond = threading.Condition(threading.RLock())
        self._tiers: TierStore | None = None
        if config.num_host_blocks:
            self._blocks = BlockManager(config.num_blocks, on_stored=lambda hashes, ids: self._tiers.enqueue(hashes, ids))
            self._tiers = TierStore(
                self.pool,
                config.num_host_blocks,
                generation=self._blocks.generation,
                disk_dir=config.disk_dir or None,
                num_disk_blocks=config.num_disk_blocks,
                on_load_done=self._wake,
                sync_loads=config.sync_tier_loads,
                host_load_gbs=config.host_load_gbs,
            )
        else:
            self._blocks = BlockManager(config.num_blocks)
        self._scheduler = Scheduler(
            self._blocks,
            self.model_name,
            config.block_size,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            self.eos_token_ids,
            start_load=(lambda _seq, hashes, block_ids: self._tiers.start_load(hashes, block_ids)) if self._tiers is not None else None,
        )
        self._runner = ModelRunner(self.model, self.pool)
        self._cuda = self.pool.device.type == "cuda"  # step timings need the device to finish first
        self._step_timings: deque[StepSample] = deque(maxlen=MAX_QUEUED_STEP_TIMINGS)
        self._seed_stream = random.Random(config.seed)
        self._live_ids: set[str] = set()
        self._abort_ids: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stopped = False

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        with self._cond:
            if self._stopped:
                raise RuntimeError("engine was stopped; create a new Engine")
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._loop, name=f"engine-{self.model_name}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the step thread and abort every queued or running request."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._cond:
            self._stopped = True
            seqs = [*self._scheduler.waiting, *self._scheduler.loading, *self._scheduler.running]
            outputs = [self._end(seq, "abort") for seq in seqs]
        self._emit(outputs)
        if self._tiers is not None:
            self._tiers.stop()

    def health(self) -> str | None:
        """None while the step thread serves; otherwise why it does not. Lock-free (plain reads),
        so the agent's event loop never waits behind a step."""
        thread = self._thread
        if self._stopping or self._stopped:
            return "the engine is stopped"
        if thread is None:
            return "the engine is not started"
        if not thread.is_alive():
            return "the engine's step thread has died (see the log); restart the worker"
        return None

    # --- requests ------------------------------------------------------------------------
    def submit(self, request: EngineRequest, sink: Sink) -> None:
        self._validate(request)
        params = request.sampling
        with self._cond:
            if self._stopping or self._stopped:
                raise RuntimeError("engine is stopped and accepts no requests")
            if request.request_id in self._live_ids:
                raise EngineInputError(f"request_id {request.request_id!r} is already in flight")
            seed = params.seed if params.seed is not None else self._seed_stream.getrandbits(63)
            seq = RequestState(
                request=request,
                sink=sink,
                generator=None if is_greedy(params.temperature) else make_generator(seed),
                token_ids=list(request.prompt_token_ids),
                num_prompt_tokens=len(request.prompt_token_ids),
                held_block_ids=list(request.held_block_ids),
            )
            self._live_ids.add(request.request_id)
            self._scheduler.enqueue(seq)
            self._cond.notify_all()

    def _validate(self, request: EngineRequest) -> None:
        self._scheduler.validate(request, vocab_size=self.vocab_size, max_tokens_limit=self.max_tokens_limit, max_context=self.max_context)

    def abort(self, request_id: str) -> None:
        """Abort a queued or running request (its sink gets a final "abort" output); unknown ids are ignored."""
        with self._cond:
            if request_id in self._live_ids:
                self._abort_ids.add(request_id)
                self._cond.notify_all()

    # --- introspection -------------------------------------------------------------------
    def load(self) -> EngineLoad:
        with self._cond:
            return self._scheduler.load()

    def take_step_timings(self) -> list[StepSample]:
        """The steps measured since the last call (at most MAX_QUEUED_STEP_TIMINGS, newest kept)."""
        with self._cond:
            timings = list(self._step_timings)
            self._step_timings.clear()
            return timings

    def take_kv_events(self) -> list[KVCacheEvent]:
        """Device events, then lower-tier events. Order only matters within a tier: the index
        keeps each (block, tier) pair apart."""
        with self._cond:
            events = self._blocks.take_events()
            if self._tiers is not None:
                events += self._tiers.take_events()
            return events

    def cached_block_hashes(self) -> list[BlockHash]:
        """Blocks cached in the device pool."""
        with self._cond:
            return self._blocks.cached_block_hashes()

    def cached_block_hashes_by_tier(self) -> dict[Tier, list[BlockHash]]:
        """Every cached block per tier (a block may be at several), for a full snapshot."""
        with self._cond:
            by_tier = {Tier.DEVICE: self._blocks.cached_block_hashes()}
            if self._tiers is not None:
                by_tier.update(self._tiers.hashes_by_tier())
            return by_tier

    def tier_stats(self) -> TierStats | None:
        """Counters of the host and disk tiers; None without them."""
        return self._tiers.snapshot_stats() if self._tiers is not None else None

    def flush_offload(self, timeout_s: float = 10.0) -> bool:
        """Waits until queued device -> host copies (and spills to disk) are done."""
        return self._tiers.flush(timeout_s) if self._tiers is not None else True

    def reset_prefix_cache(self) -> bool:
        """Forget all cached blocks at every tier (emits a cleared event); False while any cached
        block is in use."""
        with self._cond:
            done = self._blocks.reset_prefix_cache()
            if done and self._tiers is not None:
                self._tiers.clear()
            return done

    # --- KV transfer support ---------------------------------------------------------------
    def unpin(self, block_ids: Sequence[int]) -> None:
        with self._cond:
            self._blocks.release(block_ids[::-1])
            self._cond.notify_all()  # freed blocks may seat the request waiting at the queue's head

    def prompt_block_hashes(self, prompt_token_ids: Sequence[int], cache_salt: str = "") -> list[BlockHash]:
        return hash_blocks(prompt_token_ids, self.config.block_size, self.model_name, cache_salt)

    def pin_cached_prefix(self, prompt_token_ids: Sequence[int], cache_salt: str = "") -> tuple[list[BlockHash], list[int]]:
        """Pins the longest device-cached prefix of the prompt's full blocks without computing
        anything (a peer fetches them); returns (hashes, pinned block ids). unpin() releases."""
        hashes = self.prompt_block_hashes(prompt_token_ids, cache_salt)
        with self._cond:
            block_ids = self._blocks.pin_prefix(hashes)
            return hashes[: len(block_ids)], block_ids

    def missing_blocks(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        with self._cond:
            return self._blocks.missing(block_hashes)

    def allocate_for_import(self, num_blocks: int) -> list[int] | None:
        with self._cond:
            return self._blocks.allocate(num_blocks)

    def commit_import(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> list[int]:
        with self._cond:
            return self._blocks.commit_import(block_hashes, block_ids)

    def abort_import(self, block_ids: Sequence[int]) -> None:
        with self._cond:
            self._blocks.release(block_ids[::-1])
            self._cond.notify_all()

    # --- step thread ---------------------------------------------------------------------
    def _wake(self) -> None:
        """A tier load finished (the copy thread, holding no other lock): its request may join."""
        with self._cond:
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                outputs = self._process_aborts()
                chunks: list[ScheduledChunk] = []
                if not self._stopping:
                    chunks = self._scheduler.schedule()
                if not chunks and not outputs:
                    if self._stopping:
                        return
                    self._cond.wait()
                    continue
            self._emit(outputs)
            if chunks:
                self._emit(self._step(chunks))

    def _step(self, chunks: list[ScheduledChunk]) -> list[tuple[Sink, EngineOutput]]:
        features = step_features(chunks)
        try:
            started = time.perf_counter()
            logits = self._runner.forward(chunks)
            if self._cuda:
                torch.cuda.synchronize(self.pool.device)
            seconds = time.perf_counter() - started
        except Exception:
            # One request's input can break the batched forward pass: find it, keep the others.
            log.exception("engine step failed for %d requests; re-running them one at a time", len(chunks))
            return self._step_one_by_one(chunks)
        results = self._runner.sample(chunks, logits)
        with self._cond:
            self._step_timings.append(StepSample(*features, seconds=seconds))
            return self._apply_results(chunks, results)

    def _step_one_by_one(self, chunks: list[ScheduledChunk]) -> list[tuple[Sink, EngineOutput]]:
        """After a failed batched forward: each chunk alone, so only the requests that fail by
        themselves end with an error (re-writing a chunk's KV writes the same values)."""
        results: list[ChunkResult] = []
        for chunk in chunks:
            try:
                results.extend(self._runner.run([chunk]))
            except Exception as exc:
                results.append(exc)
        with self._cond:
            return self._apply_results(chunks, results)

    def _apply_results(self, chunks: list[ScheduledChunk], results: list[ChunkResult]) -> list[tuple[Sink, EngineOutput]]:
        """Accounts each chunk's outcome (under the lock); a failed chunk ends its request only."""
        outputs: list[tuple[Sink, EngineOutput]] = []
        for chunk, result in zip(chunks, results):
            if isinstance(result, Exception):
                log.warning("request %s failed in the engine step: %s", chunk.seq.request_id, result)
                outputs.append(self._end(chunk.seq, "error", f"engine step failed: {result}"))
                continue
            out = self._scheduler.update(chunk, result)
            if out is not None:
                outputs.append((chunk.seq.sink, out))
                if out.finished:
                    self._live_ids.discard(out.request_id)
        return outputs

    def _process_aborts(self) -> list[tuple[Sink, EngineOutput]]:
        outputs = []
        for request_id in sorted(self._abort_ids):
            seq = self._scheduler.find(request_id)
            if seq is not None:
                outputs.append(self._end(seq, "abort"))
        self._abort_ids.clear()
        return outputs

    def _end(self, seq: RequestState, reason: str, error: str | None = None) -> tuple[Sink, EngineOutput]:
        self._scheduler.remove(seq)
        self._live_ids.discard(seq.request_id)
        self._abort_ids.discard(seq.request_id)
        return seq.sink, seq.output([], reason, error)

    def _emit(self, outputs: list[tuple[Sink, EngineOutput]]) -> None:
        for sink, out in outputs:
            try:
                sink(out)
            except Exception:  # a broken sink must not kill the step thread
                log.exception("sink for request %s raised", out.request_id)
