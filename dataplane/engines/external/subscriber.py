"""Subscribes to an engine's ZMQ KV events and keeps the engine's cache contents, in kvplane
hashes, current; recovers lost batches through the engine's replay endpoint or a full resync.

- Live: a SUB socket on the engine's publisher (it connects; given a wildcard address such as
  tcp://*:5557 it binds, for an engine whose publisher is set to connect). Each batch is checked by a Sequencer
  (dataplane/engines/external/sequence.py) and applied to a BlockHashMapper in order.
- Gap: the lost batches are asked for on the replay endpoint (a DEALER sending the first missing
  sequence number; the publisher answers with every buffered batch from there on, then -1).
  The live batch that revealed the gap is applied after them.
- Resync, when the gap cannot be filled (no replay endpoint, no answer within `replay_timeout_s`,
  or the publisher's buffer no longer reaches back far enough): forget everything (the index
  drops this worker's blocks: it under-reports, it never claims a block the engine lacks), then
  ask the engine to empty its prefix cache through `flush` when the adapter has one, so that both
  sides agree again; later events refill the index.
- Start-up: a replay from 0, so an agent started beside a running engine learns what it holds
  (when the replay buffer reaches back to batch 0; otherwise that is a gap as above).
- A batch numbered below the next one on the live stream means the engine restarted: forget.

Runs on the agent's event loop (zmq.asyncio); `take_events` and `snapshot` are cheap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from kvplane.dataplane.engines.events import KVCacheEvent
from kvplane.dataplane.engines.external.hash_map import BlockHashMapper
from kvplane.dataplane.engines.external.sequence import Sequencer, Verdict
from kvplane.dataplane.engines.external.wire import END_OF_REPLAY, EventBatch, WireFormatError, decode_message, decode_seq
from kvplane.types import BlockHash, Tier

log = logging.getLogger(__name__)

DEFAULT_REPLAY_TIMEOUT_S = 2.0


class KVEventSubscriber:
    def __init__(
        self,
        endpoint: str,
        mapper: BlockHashMapper,
        replay_endpoint: str = "",
        topic: str = "",
        flush: Callable[[], Awaitable[bool]] | None = None,
        replay_timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.mapper = mapper
        self._topic = topic.encode()
        self._flush = flush
        self._replay_timeout_s = replay_timeout_s
        self._sequencer = Sequencer()
        self._events: list[KVCacheEvent] = []
        self._task: asyncio.Task | None = None
        self._ctx = None
        self._sub = None
        # Counters for logs, metrics and tests.
        self.num_batches = 0
        self.num_gaps = 0
        self.num_replayed = 0
        self.num_resyncs = 0
        self.num_restarts = 0
        self.num_bad_messages = 0

    @property
    def next_seq(self) -> int | None:
        return self._sequencer.next_seq

    async def start(self) -> None:
        import zmq  # noqa: PLC0415 (the [engines] extra)
        import zmq.asyncio  # noqa: PLC0415

        self._ctx = zmq.asyncio.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        if "*" in self.endpoint:
            self._sub.bind(self.endpoint)  # an engine whose publisher connects to its subscriber
        else:
            self._sub.connect(self.endpoint)
        if self.replay_endpoint:
            await self._recover(0, first_live=None)
        self._task = asyncio.create_task(self._run(), name="kv-event-subscriber")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._sub is not None:
            self._sub.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()

    def take_events(self) -> list[KVCacheEvent]:
        events, self._events = self._events, []
        return events

    def snapshot(self) -> Mapping[Tier, list[BlockHash]]:
        return self.mapper.snapshot()

    # -- the loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            frames = await self._sub.recv_multipart()
            try:
                batch = decode_message(frames)
            except WireFormatError as e:
                self.num_bad_messages += 1
                log.warning("dropping a malformed KV-event message from %s: %s", self.endpoint, e)
                continue
            await self.on_live(batch)

    async def on_live(self, batch: EventBatch) -> None:
        check = self._sequencer.check_live(batch.seq, batch.ts)
        if check.verdict is Verdict.DUPLICATE:
            return
        if check.verdict is Verdict.RESTART:
            self.num_restarts += 1
            log.warning("KV events from %s restarted at batch %d (engine restart?): forgetting its cache", self.endpoint, batch.seq)
            self._forget()
            self._sequencer.reset()
            check = self._sequencer.check_live(batch.seq, batch.ts)
        if check.verdict is Verdict.APPLY:
            self._apply(batch)
        elif check.verdict is Verdict.GAP:
            self.num_gaps += 1
            log.info("KV events from %s: batches %d..%d are missing; recovering", self.endpoint, check.missing_from, batch.seq - 1)
            await self._recover(check.missing_from, first_live=batch)

    async def _recover(self, missing_from: int, first_live: EventBatch | None) -> None:
        """Replays from `missing_from` and applies what closes the gap, then the live batch that
        revealed it (unless the replay covered it). Where the replay cannot reach back (or does not
        answer), resyncs once and carries on from the first batch it has."""
        replayed: list[EventBatch] | None = None
        if self.replay_endpoint:
            try:
                replayed = await self._replay(missing_from)
            except (TimeoutError, WireFormatError, OSError) as e:
                log.warning("KV-event replay from %s failed: %s", self.replay_endpoint, e)
        if replayed is None:
            await self.resync()
            if first_live is not None:
                self._restart_at(first_live)
            return
        resynced = False
        for batch in [*replayed, *([first_live] if first_live is not None else [])]:
            check = self._sequencer.check_replayed(batch.seq)
            if check.verdict is Verdict.DUPLICATE:
                continue
            if check.verdict is Verdict.GAP:
                if not resynced:
                    log.warning("KV events from %s: batches from %d are gone from the replay buffer", self.endpoint, check.missing_from)
                    await self.resync()
                    resynced = True
                self._restart_at(batch)
                continue
            self._apply(batch)
            if batch is not first_live:
                self.num_replayed += 1

    async def resync(self) -> None:
        """Forgets the engine's cache, and asks the engine to empty it when the adapter can."""
        self.num_resyncs += 1
        self._forget()
        if self._flush is None:
            log.warning("KV events from %s: resynced; blocks cached before the gap are unknown until stored again", self.endpoint)
            return
        try:
            flushed = await self._flush()
        except Exception as e:  # the engine may refuse while busy: the index still only under-reports
            log.warning("asking the engine to flush its prefix cache failed: %s", e)
            flushed = False
        log.warning("KV events from %s: resynced (engine prefix cache %s)", self.endpoint, "flushed" if flushed else "kept")

    def _restart_at(self, batch: EventBatch) -> None:
        """Takes `batch` as the next in order after a resync."""
        self._sequencer.applied(batch.seq - 1)
        self._apply(batch)

    async def _replay(self, start_seq: int) -> list[EventBatch]:
        import zmq  # noqa: PLC0415

        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        batches: list[EventBatch] = []
        try:
            await dealer.send_multipart([b"", start_seq.to_bytes(8, "big", signed=True)])
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), self._replay_timeout_s)
                if frames and frames[0] == b"":
                    frames = frames[1:]  # the ROUTER's empty delimiter
                if len(frames) == 3 and decode_seq(frames[1]) == END_OF_REPLAY:
                    return batches
                batches.append(decode_message(frames))
        finally:
            dealer.close(linger=0)

    def _apply(self, batch: EventBatch) -> None:
        self.num_batches += 1
        for event in batch.events:
            self._events.extend(self.mapper.apply(event))
        self._sequencer.applied(batch.seq, batch.ts)

    def _forget(self) -> None:
        self._events.extend(self.mapper.forget())
