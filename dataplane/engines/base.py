"""The engine interface: everything the agent asks of an engine, in three capability groups.

- core (`EngineAdapter`, every engine): what it serves (`info`), lifecycle, health, generate as
  an async stream of token ids, abort, detokenize (the control plane tokenizes), load, KV events (normalised to
  stored / removed / cleared with a tier, dataplane/engines/events.py) and a full cache snapshot.
- KV import/export (`KVImportExport`, optional): the engine's paged KV blocks, addressed by block
  id, moved by a kvplane transport (dataplane/transport/): the prefill side pins blocks, the
  decode side allocates, pulls, checks, then commits them to its prefix cache under the hashes it
  computes itself from the prompt (never a peer's: issue 28). An engine that moves KV its
  own way returns None here and may offer the next capability instead.
- engine-native KV transfer (`NativeKVTransfer`, optional): the engines' own connectors move the
  KV (SGLang's bootstrap host/port/room with mooncake or nixl, vLLM's kv_transfer_params with
  NixlConnector). kvplane only pairs the two sides and hands the prefill side's handoff (opaque
  bytes, the engine's own parameters) to the decode side's engine; the agent stays engine-agnostic.
  The capability's transport name starts with "engine:" (kvplane.types.NATIVE_TRANSPORT_PREFIX);
  the worker registers with it, so the control plane pairs only workers with the same one.
- profiling (`StepProfiling`, optional): measured step timings that feed the worker's step-time
  model (kvplane/latency.py) and `kvplane profile`. Without it the agent reports no latency model.

The agent reads a capability once (`engine.kv_transfer`, `engine.native_transfer`, `engine.profiling`) and refuses the RPCs
that need a missing one with FAILED_PRECONDITION, naming the engine. Nothing here imports torch:
an agent beside an external engine must not load it.

Threading: the agent calls every method from its event loop. Methods that are plain `def` must not
block (an external engine answers them from state its background tasks keep fresh); `async def`
ones may wait on the engine. The data types are in dataplane/engines/request.py and events.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kvplane.dataplane.engines.events import KVCacheEvent
from kvplane.dataplane.engines.request import EngineLoad, EngineOutput, EngineRequest
from kvplane.types import BlockHash, KVLayout, Tier

if TYPE_CHECKING:
    from kvplane.dataplane.transport.base import KVPoolLike
    from kvplane.dataplane.transport.modeled import ModeledLink
    from kvplane.latency import StepSample


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What an engine serves and the limits the control plane checks requests against.

    Reported in the worker's registration (WorkerInfo); fixed from start() on.
    """

    model: str  # the served model name, what requests name
    layout: KVLayout  # KV layout (model, layers, heads, head_dim, dtype, block size)
    max_context: int  # prompt + output tokens of one request
    vocab_size: int
    max_tokens_limit: int  # the largest max_tokens a request may ask for
    max_num_seqs: int  # requests running at once (the decode batch)
    max_num_batched_tokens: int  # tokens computed per step
    tokenizer: str = ""  # "byte": kvplane.tokenizer.ByteTokenizer; "": the model's own (WorkerInfo.tokenizer)
    hardware: str = ""  # what it runs on, e.g. "NVIDIA H100 80GB HBM3 x4" ("": not known; WorkerInfo.hardware)
    link_gb_per_s: float = 0.0  # KV between it and its peers, GB/s (0: not known; WorkerInfo.link_gb_per_s)


class KVImportExport(Protocol):
    """KV blocks of a paged pool, moved between engines by a kvplane transport.

    Block ids index `pool`. A pinned or imported block holds a reference the caller owns and must
    give back exactly once (unpin, abort_import, or by passing it in EngineRequest.held_block_ids).
    """

    @property
    def pool(self) -> KVPoolLike:
        """The pool a transport reads from and writes into (one contiguous buffer of blocks)."""
        ...

    @property
    def modeled_link(self) -> ModeledLink | None:
        """None when the pool holds the KV itself. A simulated engine's pool holds a scaled-down
        payload per block; its transfers then report the model's bytes and take this link's time
        (dataplane/transport/modeled.py)."""
        ...

    def prompt_block_hashes(self, prompt_token_ids: Sequence[int], cache_salt: str = "") -> list[BlockHash]:
        """The hashes this engine caches the prompt's full blocks under (kvplane.block_hash, with
        the engine's model salt and the request's cache salt). An importer commits pulled blocks
        only under these, computed from the prompt it was given: never under hashes a peer sent."""
        ...

    def pin_cached_prefix(self, prompt_token_ids: Sequence[int], cache_salt: str = "") -> tuple[list[BlockHash], list[int]]:
        """Pins the longest cached prefix of the prompt's full blocks without computing anything;
        returns (their hashes, the pinned block ids), both in prefix order."""
        ...

    def missing_blocks(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """Indices into block_hashes of the blocks this engine's prefix cache does not hold."""
        ...

    def allocate_for_import(self, num_blocks: int) -> list[int] | None:
        """Reserves free blocks to pull into; None (not an exception) when they do not fit."""
        ...

    def commit_import(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> list[int]:
        """Registers pulled blocks in the prefix cache; returns the block id holding each hash
        (another copy when the hash arrived meanwhile; the reference moves to it). The caller
        holds one reference on each returned id. `block_hashes` are the importer's own
        (prompt_block_hashes), and the blocks' bytes passed dataplane/transport/integrity.py."""
        ...

    def abort_import(self, block_ids: Sequence[int]) -> None:
        """Frees blocks from allocate_for_import whose pull failed."""
        ...

    def unpin(self, block_ids: Sequence[int]) -> None:
        """Gives back references from pin_cached_prefix, commit_import or a prefill_only output."""
        ...


@dataclass(frozen=True, slots=True)
class NativeHandoff:
    """What a prefill-side engine hands the decode-side engine, and what the prefill did."""

    transport: str  # the capability's transport name, e.g. "engine:vllm-nixl"
    params: bytes  # engine-specific (JSON): passed unchanged to the decode side's generate
    num_prompt_tokens: int
    num_cached_tokens: int  # of the prompt, found in the prefill side's prefix cache
    num_blocks: int  # KV blocks the decode side receives (from the engine, or ceil(prompt / block size))


class NativeKVTransfer(Protocol):
    """Disaggregation through the engines' own KV connectors (see the module docstring)."""

    @property
    def transport(self) -> str:
        """The transport name both sides must share, starting with "engine:"."""
        ...

    async def prefill(self, request: EngineRequest) -> NativeHandoff:
        """Prefill side: has the engine prefill `request` for a remote decode and returns the
        handoff. Returns once the decode side can be started: after the prefill (vLLM), or as soon
        as the engine accepted it (SGLang: the prefill waits for the decode side to connect to its
        bootstrap room). Refusals raise EngineInputError / EngineCapacityError; a failure raises
        RuntimeError with the engine's reason."""
        ...


class StepProfiling(Protocol):
    def take_step_timings(self) -> list[StepSample]:
        """The engine steps measured since the last call, oldest first (bounded; oldest dropped)."""
        ...


class EngineAdapter(Protocol):
    """The core every engine offers; see the module docstring for the capability groups."""

    @property
    def info(self) -> EngineInfo: ...

    async def start(self) -> None:
        """Starts serving (or connects to the engine server); `info` is valid afterwards."""
        ...

    async def stop(self) -> None:
        """Stops; every request still in flight ends with finish_reason "abort"."""
        ...

    def health(self) -> str | None:
        """None while the engine serves; otherwise why not, in words (the agent then refuses new
        requests with UNAVAILABLE and that reason)."""
        ...

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Queues the request and returns its outputs as an async iterator, in order; the last one
        has finished=True. Refusal happens here, before any output: EngineInputError (the request
        itself is invalid) or EngineCapacityError (it can never fit). A failure after acceptance
        is a final output with finish_reason "error" and `error` set.

        request.prefill_only: compute the prompt's KV and emit no token; with KV import/export the
        final output also carries the prompt's full block hashes and their pinned ids (the caller
        unpins them). request.held_block_ids needs KV import/export; an engine without it raises
        EngineInputError for a non-empty list.
        """
        ...

    def abort(self, request_id: str) -> None:
        """Asks the engine to stop a queued or running request; returns at once. Its stream ends
        with finish_reason "abort". Unknown or finished ids are ignored."""
        ...

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of `token_ids`, special tokens skipped; a cut multi-byte character decodes as
        U+FFFD (never raises), so a stream can be decoded a prefix at a time."""
        ...

    def load(self) -> EngineLoad:
        """The latest load the engine knows (the agent calls this often: keep it cheap)."""
        ...

    def take_kv_events(self) -> list[KVCacheEvent]:
        """KV events since the last call. Order matters only within one tier."""
        ...

    def cached_block_hashes_by_tier(self) -> Mapping[Tier, list[BlockHash]]:
        """Every cached block per tier (a block may be at several), for a full snapshot."""
        ...

    @property
    def kv_transfer(self) -> KVImportExport | None:
        """The KV import/export capability, or None when KV moves some other way (or not at all)."""
        ...

    @property
    def native_transfer(self) -> NativeKVTransfer | None:
        """The engine-native KV transfer capability, or None. Decode side: a request whose
        `native_handoff` is set resumes from that handoff (EngineInputError when it has none)."""
        ...

    @property
    def profiling(self) -> StepProfiling | None:
        """The step-timing capability, or None when the engine does not measure its steps."""
        ...
