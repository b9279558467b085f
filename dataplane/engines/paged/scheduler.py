"""Continuous-batching scheduler with reserve-at-admission and chunked prefill (no torch here).

Rule: requests are admitted first come first served (by when they reached the worker,
EngineRequest.queued_since: a disaggregated request submitted once its KV is in takes the place
it had on arrival) while fewer than max_num_seqs run and the pool can reserve every block the
request can ever need, ceil((prompt + max_tokens) / block_size) (prompt only for
prefill_only), minus the blocks of its cached prefix; the head of the queue
waits rather than being overtaken, and nothing is ever preempted. A request whose next prefix
blocks a running request is prefilling now waits until they are registered and reuses them instead
of computing them again (SGLang's in-batch prefix caching holds such a request back the same way):
a burst sharing a new prefix computes it once, as the control plane's predicted prefixes assume.
The cached prefix is capped at (len(prompt) - 1) // block_size blocks so at least one prompt
token is computed and yields logits.
With lower KV tiers, the blocks right after the device-cached prefix that a lower tier holds are
copied into the request's fresh blocks (`start_load`, begun at admission) and count as cached:
prefill continues after them. A request whose load is in flight holds its seat and its blocks but
joins the batch only once its blocks are in, so the running requests never wait for another
request's copy; cancelled mid-load, its blocks are released when the copy stops (never while a
copy may still write them). Each step spends max_num_batched_tokens: one token per decoding
request first, then prompt chunks in order of arrival (queued_since). A full block is
registered in the prefix cache in the step its KV is written.
`step_features` gives a planned step's shape (kvplane.latency's step-time features), what a step
costs in any engine that runs these chunks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Protocol

from kvplane.block_hash import chain_hash, root_hash
from kvplane.dataplane.engines.paged.block_manager import BlockManager
from kvplane.dataplane.engines.request import EngineCapacityError, EngineInputError, EngineLoad, EngineOutput, EngineRequest
from kvplane.latency import prefill_attention
from kvplane.sampling import sampling_problem
from kvplane.types import BlockHash


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class LoadHandle(Protocol):
    """A lower-tier load in flight (the reference engine's TierLoad)."""

    def poll(self) -> int | None:
        """None while copying; then how many leading blocks were loaded."""
        ...

    def cancel(self) -> None:
        """Stop after the block being copied; poll() still reports when the copy has stopped."""
        ...


# (request, hashes, fresh block ids) -> the load of the leading hashes a lower tier holds, or None
# (none held). An engine whose copies take time of their own (the sim engine: virtual time) answers
# poll() with None until enough of the copy is in for the request to prefill.
StartLoad = Callable[["RequestState", list[BlockHash], list[int]], LoadHandle | None]


@dataclass(slots=True, eq=False)
class RequestState:
    """One request inside the engine, waiting or running: its tokens, blocks and progress."""

    request: EngineRequest
    sink: Callable[[EngineOutput], None]
    generator: Any  # torch.Generator for temperature sampling, else None
    token_ids: list[int]  # prompt then generated tokens
    num_prompt_tokens: int
    held_block_ids: list[int] = field(default_factory=list)  # caller's refs, released at admission
    block_ids: list[int] = field(default_factory=list)  # own refs, in position order
    block_hashes: list[BlockHash] = field(default_factory=list)  # chained hashes of full blocks
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_loaded_tokens: int = 0  # of the cached tokens, those copied back from a lower tier
    num_disk_loaded_tokens: int = 0  # of the loaded tokens, those read from disk (engines that tell)
    num_registered_blocks: int = 0
    num_output_tokens: int = 0
    admitted_at: float = 0.0  # the scheduler's clock at admission, for queue/prefill timings
    queued_since: float = 0.0  # its place in the queue (EngineRequest.queued_since, else when enqueued)
    tier_load: LoadHandle | None = None  # its lower-tier load while in flight

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    def output(self, new_token_ids: list[int], finish_reason: str | None = None, error: str | None = None) -> EngineOutput:
        return EngineOutput(
            request_id=self.request_id,
            new_token_ids=new_token_ids,
            finished=finish_reason is not None,
            finish_reason=finish_reason,
            num_prompt_tokens=self.num_prompt_tokens,
            num_cached_tokens=self.num_cached_tokens,
            error=error,
            admitted_at=self.admitted_at,
            num_loaded_tokens=self.num_loaded_tokens,
            num_disk_loaded_tokens=self.num_disk_loaded_tokens,
        )


@dataclass(slots=True, frozen=True)
class ScheduledChunk:
    seq: RequestState
    start: int  # position of the first token computed this step
    num_tokens: int

    @property
    def completes_known_tokens(self) -> bool:
        """After this chunk every known token has KV, so the last position's logits are due."""
        return self.start + self.num_tokens == len(self.seq.token_ids)


def step_features(chunks: list[ScheduledChunk]) -> tuple[int, int, int, int]:
    """(prefill_tokens, prefill_attention, decode_seqs, decode_context_tokens) of one step."""
    prefill_tokens = attention = decode_seqs = decode_context = 0
    for c in chunks:
        if c.start < c.seq.num_prompt_tokens:  # a prompt chunk (its context: cached + earlier chunks)
            prefill_tokens += c.num_tokens
            attention += prefill_attention(c.num_tokens, c.start)
        else:  # one generated token, attending over everything before it
            decode_seqs += 1
            decode_context += c.start + c.num_tokens
    return prefill_tokens, attention, decode_seqs, decode_context


class Scheduler:
    __slots__ = (
        "blocks",
        "model_name",
        "block_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "eos_token_ids",
        "waiting",
        "running",
        "loading",
        "_stopped_loads",
        "start_load",
        "clock",
    )

    def __init__(
        self,
        blocks: BlockManager,
        model_name: str,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        eos_token_ids: tuple[int, ...],
        start_load: StartLoad | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.blocks = blocks
        self.model_name = model_name
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos_token_ids = eos_token_ids
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.loading: list[RequestState] = []  # admitted, their lower-tier load in flight
        self._stopped_loads: list[tuple[LoadHandle, list[int]]] = []  # cancelled: blocks freed when the copy stops
        self.start_load = start_load
        self.clock = clock  # admission times (a simulator passes its virtual clock)

    # --- bookkeeping ---------------------------------------------------------------------
    def num_blocks_needed(self, request: EngineRequest) -> int:
        num_tokens = len(request.prompt_token_ids)
        if not request.prefill_only:
            num_tokens += request.sampling.max_tokens
        return cdiv(num_tokens, self.block_size)

    def validate(self, request: EngineRequest, *, vocab_size: int, max_tokens_limit: int, max_context: int) -> None:
        """EngineInputError for an invalid request, EngineCapacityError for one that can never fit."""
        p = request.sampling
        prompt = request.prompt_token_ids
        if not request.request_id:
            raise EngineInputError("request_id is empty")
        if not prompt:
            raise EngineInputError("prompt_token_ids is empty; a request needs at least one prompt token")
        if p.max_tokens <= 0:
            raise EngineInputError(f"max_tokens must be at least 1, got {p.max_tokens}")
        if p.max_tokens > max_tokens_limit:
            raise EngineInputError(f"max_tokens {p.max_tokens} exceeds this engine's limit of {max_tokens_limit}")
        if len(prompt) + p.max_tokens > max_context:
            raise EngineInputError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({p.max_tokens}) exceeds the model's context of "
                f"{max_context} tokens; shorten the prompt or lower max_tokens"
            )
        if min(prompt) < 0 or max(prompt) >= vocab_size:  # the loop only to name the first bad one
            i, t = next((i, t) for i, t in enumerate(prompt) if not 0 <= t < vocab_size)
            raise EngineInputError(f"prompt token {i} has id {t}, outside the vocabulary (0..{vocab_size - 1})")
        problem = sampling_problem(p.temperature, p.top_p, p.top_k)  # NaN and infinities included
        if problem is not None:
            raise EngineInputError(problem)
        num_blocks = self.blocks.num_blocks
        for b in request.held_block_ids:
            if not 0 <= b < num_blocks:
                raise EngineInputError(f"held block id {b} is outside the pool (0..{num_blocks - 1})")
        needed = self.num_blocks_needed(request)
        if needed > num_blocks:
            raise EngineCapacityError(
                f"request needs {needed} KV blocks of {self.block_size} tokens but the pool has only "
                f"{num_blocks}; lower max_tokens or the prompt length, or raise num_blocks"
            )

    def load(self) -> EngineLoad:
        """What is queued, running and held now (the engine's load report)."""
        blocks = self.blocks
        admitted = (*self.running, *self.loading)  # a loading request holds its seat and blocks
        remaining = tuple(0 if seq.request.prefill_only else seq.request.sampling.max_tokens - seq.num_output_tokens for seq in admitted)
        return EngineLoad(
            num_running=len(admitted),
            num_waiting=len(self.waiting),
            num_queued_prefill_tokens=self.num_queued_prefill_tokens(),
            num_free_blocks=blocks.num_free_blocks,
            num_used_blocks=blocks.num_used_blocks,
            num_total_blocks=blocks.num_blocks,
            num_cached_blocks=blocks.num_cached_free_blocks,
            running_remaining_tokens=remaining,
            running_context_tokens=sum(len(seq.token_ids) for seq in admitted),
        )

    def num_queued_prefill_tokens(self) -> int:
        """Prompt tokens still to compute: a waiting request's prompt less the prefix cached on the
        device now or being prefilled by a running request (what it will reuse: admission waits
        for the latter, `_ready_prefix_blocks`; a request of an agent loop queued behind a step
        otherwise looks like its whole context to compute, and the control plane moves the next
        request away from the prefix's holder), then the prefilling requests' remainders."""
        computing = self._blocks_being_computed()
        queued = sum(s.num_prompt_tokens - self._ready_prefix_blocks(s, computing)[1] * self.block_size for s in self.waiting)
        return queued + sum(s.num_prompt_tokens - s.num_computed_tokens for s in (*self.running, *self.loading) if s.is_prefilling)

    def _blocks_being_computed(self) -> set[BlockHash]:
        """The full prompt blocks the running requests are prefilling and have not registered yet."""
        computing: set[BlockHash] = set()
        for seq in self.running:
            if seq.is_prefilling:
                num_full = seq.num_prompt_tokens // self.block_size
                self._extend_hashes(seq, num_full)
                computing.update(seq.block_hashes[seq.num_registered_blocks : num_full])
        return computing

    def _ready_prefix_blocks(self, seq: RequestState, computing: set[BlockHash]) -> tuple[int, int]:
        """(blocks of the prompt's prefix cached on the device now, blocks cached or being
        computed by a running request): what the request reuses if admitted now, and if it waits."""
        reusable = self._reusable_hashes(seq)
        cached = len(self.blocks.longest_cached_prefix(reusable))
        ready = cached
        while ready < len(reusable) and reusable[ready] in computing:
            ready += 1
        return cached, ready

    def _reusable_hashes(self, seq: RequestState) -> list[BlockHash]:
        """The hashes of the prompt's blocks a cached prefix may cover: at most (prompt - 1) //
        block_size, so at least one prompt token is computed and yields logits."""
        self._extend_hashes(seq, seq.num_prompt_tokens // self.block_size)
        return seq.block_hashes[: (seq.num_prompt_tokens - 1) // self.block_size]

    def find(self, request_id: str) -> RequestState | None:
        for seq in (*self.waiting, *self.loading, *self.running):
            if seq.request_id == request_id:
                return seq
        return None

    def _extend_hashes(self, seq: RequestState, num_full_blocks: int) -> None:
        bs = self.block_size
        while len(seq.block_hashes) < num_full_blocks:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else root_hash(self.model_name, seq.request.cache_salt)
            seq.block_hashes.append(chain_hash(parent, seq.token_ids[i * bs : (i + 1) * bs]))

    # --- scheduling ----------------------------------------------------------------------
    def enqueue(self, seq: RequestState) -> None:
        """Queues a submitted request by when it reached the worker: behind every waiting request
        that came before it, ahead of those that came later."""
        since = seq.request.queued_since
        seq.queued_since = self.clock() if since is None else since
        waiting = self.waiting
        i = len(waiting)
        while i > 0 and waiting[i - 1].queued_since > seq.queued_since:
            i -= 1
        waiting.insert(i, seq)

    def admit(self) -> None:
        self._collect_loads()
        while self.waiting and len(self.running) + len(self.loading) < self.max_num_seqs:
            seq = self.waiting[0]
            if self.running:
                cached, ready = self._ready_prefix_blocks(seq, self._blocks_being_computed())
                if ready > cached:
                    return  # a running request is computing its next blocks: reuse them, not recompute
            reusable = self._reusable_hashes(seq)
            max_hit = len(reusable)
            got = self.blocks.allocate_with_prefix(reusable, self.num_blocks_needed(seq.request))
            if got is None:
                return  # the head waits for blocks; later requests do not overtake it
            self.waiting.popleft()
            seq.admitted_at = self.clock()
            seq.block_ids, num_hit_blocks = got
            seq.num_computed_tokens = seq.num_cached_tokens = num_hit_blocks * self.block_size
            self._release_held(seq)
            load = None
            if self.start_load is not None and num_hit_blocks < max_hit:
                span = slice(num_hit_blocks, max_hit)
                load = self.start_load(seq, seq.block_hashes[span], seq.block_ids[span])
            num_loaded = load.poll() if load is not None else 0  # a synchronous load is done already
            if num_loaded is None:
                seq.tier_load = load
                self.loading.append(seq)
            else:
                self._join_batch(seq, num_loaded)

    def _collect_loads(self) -> None:
        """Moves requests whose blocks are in into the batch; frees the blocks of cancelled loads
        whose copy has stopped."""
        waiting_for: list[RequestState] = []
        for seq in self.loading:
            assert seq.tier_load is not None
            num_loaded = seq.tier_load.poll()
            if num_loaded is None:
                waiting_for.append(seq)
            else:
                seq.tier_load = None
                self._join_batch(seq, num_loaded)
        self.loading = waiting_for
        if self._stopped_loads:
            still_copying = []
            for handle, block_ids in self._stopped_loads:
                if handle.poll() is None:
                    still_copying.append((handle, block_ids))
                else:
                    self.blocks.release(block_ids)
            self._stopped_loads = still_copying

    def _join_batch(self, seq: RequestState, num_loaded: int) -> None:
        """The request's blocks are in: its device hits plus num_loaded blocks from a lower tier."""
        num_hit_blocks = seq.num_computed_tokens // self.block_size
        if num_loaded:
            span = slice(num_hit_blocks, num_hit_blocks + num_loaded)
            self.blocks.register(seq.block_hashes[span], seq.block_ids[span])
            num_hit_blocks += num_loaded
            seq.num_loaded_tokens = num_loaded * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens = num_hit_blocks * self.block_size
        seq.num_registered_blocks = num_hit_blocks
        self.running.append(seq)

    def schedule(self) -> list[ScheduledChunk]:
        """Admit what fits and what finished loading, then plan this step's tokens."""
        self.admit()
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        for seq in self.running:
            if not seq.is_prefilling:
                chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, 1))
                budget -= 1
        # Prompt chunks by arrival at the worker: a request that came before another prefills
        # before it even when it was admitted after it (its KV came from a remote prefill).
        prefilling = sorted((seq for seq in self.running if seq.is_prefilling), key=attrgetter("queued_since"))
        for seq in prefilling:
            if budget > 0:
                n = min(seq.num_prompt_tokens - seq.num_computed_tokens, budget)
                chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, n))
                budget -= n
        return chunks

    def update(self, chunk: ScheduledChunk, sampled_token: int | None) -> EngineOutput | None:
        """Account one computed chunk (its KV is written); returns the output to send, if any."""
        seq = chunk.seq
        seq.num_computed_tokens = chunk.start + chunk.num_tokens
        self._register_full_blocks(seq)
        if seq.is_prefilling:
            return None
        if seq.request.prefill_only:
            return self._finish_prefill_only(seq)
        assert sampled_token is not None
        seq.token_ids.append(sampled_token)
        seq.num_output_tokens += 1
        params = seq.request.sampling
        reason = None
        if not params.ignore_eos and sampled_token in self.eos_token_ids:
            reason = "eos"
        elif sampled_token in params.stop_token_ids:
            reason = "stop"
        elif seq.num_output_tokens >= params.max_tokens:
            reason = "length"
        if reason is not None:
            self._free(seq)
        return seq.output([sampled_token], reason)

    def _register_full_blocks(self, seq: RequestState) -> None:
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_registered_blocks:
            return
        self._extend_hashes(seq, num_full)
        first = seq.num_registered_blocks
        self.blocks.register(seq.block_hashes[first:num_full], seq.block_ids[first:num_full])
        seq.num_registered_blocks = num_full

    def _finish_prefill_only(self, seq: RequestState) -> EngineOutput:
        num_full = seq.num_prompt_tokens // self.block_size
        hashes = seq.block_hashes[:num_full]
        pinned: list[int] = []
        for i, h in enumerate(hashes):
            holder = self.blocks.lookup(h)
            if holder is None:
                # Another copy held this hash when we computed it and has since been evicted:
                # our own block has the same KV, so publish it now.
                holder = self.blocks.register([h], [seq.block_ids[i]])[0]
            self.blocks.take_ref(holder)
            pinned.append(holder)
        self._free(seq)
        out = seq.output([], "length")
        out.block_hashes = list(hashes)
        out.pinned_block_ids = pinned
        return out

    # --- ending requests -----------------------------------------------------------------
    def _release_held(self, seq: RequestState) -> None:
        held, seq.held_block_ids = seq.held_block_ids, []
        if held:
            self.blocks.release(held)

    def _free(self, seq: RequestState) -> None:
        if seq in self.running:
            self.running.remove(seq)
        # Tail first, so the LRU evicts a chain's tail before its head.
        self.blocks.release(seq.block_ids[::-1])
        seq.block_ids = []
        self._release_held(seq)

    def remove(self, seq: RequestState) -> None:
        """Drop a waiting or running request and everything it holds (abort, error, stop)."""
        if seq in self.waiting:
            self.waiting.remove(seq)
            self._release_held(seq)
        elif seq in self.loading:
            # The copy may still be writing its blocks: they go back to the pool when it stops.
            self.loading.remove(seq)
            assert seq.tier_load is not None
            seq.tier_load.cancel()
            self._stopped_loads.append((seq.tier_load, seq.block_ids[::-1]))
            seq.tier_load = None
            seq.block_ids = []
        else:
            self._free(seq)
