"""What the vLLM and SGLang adapters share: connecting to the engine server, the served model's
EngineInfo, load and health from a background poll, KV events from the subscriber, and the
requests in flight. Each adapter subclasses ExternalEngine and speaks its server's own API.

Health: the engine serves while its last poll answered; a failed poll makes health() name the
reason at once (the agent then answers UNAVAILABLE, and exits when it lasts: see
dataplane/agent/server.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from kvplane.dataplane.engines.base import EngineInfo, KVImportExport, StepProfiling
from kvplane.dataplane.engines.events import KVCacheEvent
from kvplane.dataplane.engines.external.config import ExternalEngineConfig
from kvplane.dataplane.engines.external.hash_map import BlockHashMapper
from kvplane.dataplane.engines.external.inflight import InFlight
from kvplane.dataplane.engines.external.model_config import kv_dtype, read_model_shape
from kvplane.dataplane.engines.external.salts import EngineSalts
from kvplane.dataplane.engines.external.subscriber import KVEventSubscriber
from kvplane.dataplane.engines.request import EngineLoad
from kvplane.types import BlockHash, KVLayout, Tier

log = logging.getLogger(__name__)

# An engine reports a request's end to its client a moment before it frees the request's KV (and
# drops it from its running count): a load sample taken within this long after a request ended
# may still count it, so such samples are corrected as if taken before the end.
RELEASE_GRACE_S = 0.5


class EngineUnreachable(Exception):
    """The server does not answer (yet): start() retries until its timeout."""


@dataclass(frozen=True, slots=True)
class ServerDescription:
    """What the server says about itself at start."""

    served_model: str  # the name requests use (and the model salt of kvplane's block hashes)
    model_path: str  # where its checkpoint is (for the model's shape)
    block_size: int  # tokens per KV block (vLLM --block-size, SGLang --page-size)
    kv_dtype: str  # the engine's KV cache dtype ("auto" = the model's)
    max_context: int
    num_total_blocks: int  # KV blocks in its pool (0 = unknown)
    max_num_seqs: int = 0  # 0 = not reported
    max_num_batched_tokens: int = 0
    vocab_size: int = 0  # 0 = take the model config's


@dataclass(frozen=True, slots=True)
class LoadSample:
    num_running: int
    num_waiting: int
    num_used_blocks: int


class ExternalEngine:
    """Base of an adapter to an engine server (dataplane/engines/base.py's EngineAdapter)."""

    NAME = "external"

    def __init__(self, config: ExternalEngineConfig, endpoint: str) -> None:
        self.config = config
        self.endpoint = endpoint
        self.inflight = InFlight()
        # Cache salts as sent to the engine and back (an adapter whose engine restricts them sends
        # salts.alias(salt); the KV-event mapper takes the engine's salt back to kvplane's).
        self.salts = EngineSalts()
        self.description: ServerDescription | None = None
        self.subscriber: KVEventSubscriber | None = None
        self._info: EngineInfo | None = None
        self._sample = LoadSample(0, 0, 0)
        self._sample_at = 0.0  # time.monotonic() when the sample was requested
        self._down_reason: str | None = "not started"
        self._poller: asyncio.Task | None = None

    # -- what a subclass provides ----------------------------------------------------------------

    async def describe(self) -> ServerDescription:
        """Raises EngineUnreachable while the server does not answer."""
        raise NotImplementedError

    async def read_load(self) -> LoadSample:
        raise NotImplementedError

    async def flush_cache(self) -> bool:
        """Empties the engine's prefix cache (for a KV-event resync); False if it cannot."""
        return False

    async def close(self) -> None:
        """Closes connections to the server (the base stops the poll and the subscriber)."""

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def info(self) -> EngineInfo:
        if self._info is None:
            raise RuntimeError(f"the {self.NAME} adapter is not started")
        return self._info

    async def start(self) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        while True:
            try:
                description = await self.describe()
                break
            except EngineUnreachable as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the {self.NAME} server at {self.endpoint} did not answer within {self.config.start_timeout_s:g} s ({e}); "
                        "is it running, and is --engine-endpoint its address?"
                    ) from None
                await asyncio.sleep(1.0)
        self.description = description
        self.inflight.block_size = description.block_size
        model_dir = self.config.model_config or description.model_path
        shape = read_model_shape(model_dir)
        layout = KVLayout(
            model=description.served_model,
            num_layers=shape.num_layers,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=kv_dtype(description.kv_dtype, shape),
            block_size=description.block_size,
        )
        # Some servers report a context longer than the model's positions (SGLang without
        # --context-length reports its token budget): the model's limit wins.
        max_context = min(n for n in (description.max_context, shape.max_position_embeddings) if n > 0)
        self._info = EngineInfo(
            model=description.served_model,
            layout=layout,
            max_context=max_context,
            vocab_size=description.vocab_size or shape.vocab_size,
            max_tokens_limit=max_context,
            max_num_seqs=description.max_num_seqs,
            max_num_batched_tokens=description.max_num_batched_tokens,
        )
        self.subscriber = KVEventSubscriber(
            self.config.kv_events_endpoint,
            BlockHashMapper(description.served_model, description.block_size, salt_of=self.salts.salt),
            replay_endpoint=self.config.kv_events_replay_endpoint,
            topic=self.config.kv_events_topic,
            flush=self.flush_cache,
        )
        await self.subscriber.start()
        await self._poll_once()
        self._poller = asyncio.create_task(self._poll_loop(), name=f"{self.NAME}-load-poll")
        log.info("connected to the %s server at %s: model %s, %d-token blocks, %d blocks, KV events from %s",
                 self.NAME, self.endpoint, description.served_model, description.block_size,
                 description.num_total_blocks, self.config.kv_events_endpoint)  # fmt: skip

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self.subscriber is not None:
            await self.subscriber.stop()
        await self.close()
        self._down_reason = "stopped"

    def health(self) -> str | None:
        return self._down_reason

    async def _poll_once(self) -> None:
        asked_at = time.monotonic()
        try:
            self._sample = await self.read_load()
            self._sample_at = asked_at
            self._down_reason = None
        except Exception as e:  # any failure to answer is the engine not serving
            self._down_reason = f"the {self.NAME} server at {self.endpoint} does not answer: {e or type(e).__name__}"

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.load_poll_interval_s)
            await self._poll_once()

    # -- what the agent reads -----------------------------------------------------------------------

    def load(self) -> EngineLoad:
        sample, inflight = self._sample, self.inflight
        total = self.description.num_total_blocks if self.description else 0
        # The sample lags by up to a poll: take out the blocks of requests that ended since.
        sampled = self._sample_at - RELEASE_GRACE_S
        used = max(sample.num_used_blocks - inflight.blocks_released_since(sampled), 0)
        used = min(used, total) if total else used
        held = self.subscriber.mapper.num_held(Tier.DEVICE) if self.subscriber else 0
        # The requests this agent has in flight are exact; the engine's counts add other clients'
        # requests, but only when they are newer than this agent's last start or end.
        fresh = sampled >= inflight.changed_at
        return EngineLoad(
            num_running=max(sample.num_running, inflight.num_running) if fresh else inflight.num_running,
            num_waiting=max(sample.num_waiting, inflight.num_waiting) if fresh else inflight.num_waiting,
            num_queued_prefill_tokens=inflight.num_queued_prefill_tokens,
            num_free_blocks=max(total - used, 0),
            num_used_blocks=used,
            num_total_blocks=total,
            num_cached_blocks=max(held - used, 0),
            running_remaining_tokens=inflight.running_remaining_tokens,
            running_context_tokens=inflight.running_context_tokens,
        )

    def take_kv_events(self) -> list[KVCacheEvent]:
        return self.subscriber.take_events() if self.subscriber else []

    def cached_block_hashes_by_tier(self) -> Mapping[Tier, list[BlockHash]]:
        return self.subscriber.snapshot() if self.subscriber else {Tier.DEVICE: []}

    @property
    def kv_transfer(self) -> KVImportExport | None:
        return None  # KV lives in the engine's own process: kvplane's transports cannot address it

    @property
    def profiling(self) -> StepProfiling | None:
        return None  # the engine's steps are not visible from outside
