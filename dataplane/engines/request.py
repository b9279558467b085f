"""Request, output and load types and their errors: the data every engine speaks (base.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvplane.types import BlockHash


class EngineInputError(ValueError):
    """The request itself is invalid; retrying it unchanged will fail again."""


class EngineCapacityError(RuntimeError):
    """The request can never fit in this engine's KV pool."""


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # 1 (or 0) = off
    top_k: int = 0  # 0 = off
    seed: int | None = None  # None = drawn from the engine's seeded stream
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(slots=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    cache_salt: str = ""
    prefill_only: bool = False
    # Refs the caller holds (e.g. on imported blocks); the engine releases them once the request
    # has taken its own refs on its cached prefix, at admission (or when it ends unadmitted).
    held_block_ids: list[int] = field(default_factory=list)
    # Engine-native disaggregation, decode side: the prefill side's NativeHandoff.params (base.py).
    native_handoff: bytes = b""
    # When the request reached this worker, on the engine scheduler's clock (None: when it is
    # submitted). A disaggregated request is submitted once its KV is in and queues by this time,
    # in the place it had when it arrived: requests that came later do not go first. (vLLM keeps a
    # request waiting for remote KV in its place in the queue the same way.)
    queued_since: float | None = None


@dataclass(slots=True)
class EngineOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "length" | "stop" | "eos" | "abort" | "error"
    num_prompt_tokens: int
    num_cached_tokens: int
    error: str | None = None
    # prefill_only requests, final output: the prompt's full blocks, pinned for transfer.
    block_hashes: list[BlockHash] = field(default_factory=list)
    pinned_block_ids: list[int] = field(default_factory=list)
    admitted_at: float = 0.0  # time.monotonic() when the scheduler admitted it (0 = never admitted)
    num_loaded_tokens: int = 0  # of num_cached_tokens, those copied back from the host or disk tier
    num_disk_loaded_tokens: int = 0  # of num_loaded_tokens, those read from disk (0 where an engine does not tell)


@dataclass(slots=True, frozen=True)
class EngineLoad:
    num_running: int
    num_waiting: int
    num_queued_prefill_tokens: int
    num_free_blocks: int
    num_used_blocks: int
    num_total_blocks: int
    num_cached_blocks: int  # unreferenced blocks kept for prefix reuse
    # Tokens each running request may still generate (max_tokens - generated; 0 for prefill_only):
    # an upper bound on when its decode slot frees up, since EOS may end it sooner.
    running_remaining_tokens: tuple[int, ...] = ()
    running_context_tokens: int = 0  # prompt + generated tokens of the running requests
