"""SimAdapter: the sim engine behind the engine interface, in an agent's event loop.

One asyncio task drives the step machine (engine.py): begin a step, sleep its simulated time
divided by `speedup` (simulated seconds per wall second), end it, repeat; it waits on an event
while nothing can run. So a simulated GPU costs the agent's CPU only its bookkeeping. Step
timings go to the agent in wall seconds (what the control plane measures requests in), and KV
transfers cross the configured link, modeled (dataplane/transport/modeled.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Sequence

from kvplane import hardware
from kvplane.dataplane.engines.base import EngineInfo, StepProfiling
from kvplane.dataplane.engines.paged.adapter import PagedEngineAdapter, outputs_until_finished
from kvplane.dataplane.engines.request import EngineOutput, EngineRequest
from kvplane.dataplane.engines.sim.config import SimConfig
from kvplane.dataplane.engines.sim.engine import SimEngine
from kvplane.dataplane.transport.modeled import ModeledLink
from kvplane.latency import StepSample
from kvplane.tokenizer import ByteTokenizer

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.01  # how often a blocked queue is looked at again (a peer's pull frees blocks silently)
_BYTES = ByteTokenizer()


class SimAdapter(PagedEngineAdapter):
    def __init__(self, config: SimConfig) -> None:
        self.config = config.validate()
        self._speedup = config.speedup
        self.engine = SimEngine(config, clock=time.monotonic)
        self.engine.modeled_link = ModeledLink(hardware.link(config.link), self.engine.layout.block_nbytes, config.speedup)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._failure: str | None = None

    @property
    def info(self) -> EngineInfo:
        return self.engine.info

    async def start(self) -> None:
        if self._task is None:
            self._wake = asyncio.Event()  # bound to the running loop
            self._task = asyncio.create_task(self._run(), name="sim-engine")
            self._task.add_done_callback(self._on_done)

    async def stop(self) -> None:
        self.engine.stop()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def health(self) -> str | None:
        if self.engine.stopped:
            return "the engine is stopped"
        if self._task is None:
            return "the engine is not started"
        return self._failure

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
        self.engine.submit(request, queue.put_nowait)  # raises before the stream exists
        self._wake.set()
        return outputs_until_finished(queue)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        return _BYTES.decode(token_ids)  # the tokenizer the sim engine reports (WorkerInfo.tokenizer "byte")

    @property
    def profiling(self) -> StepProfiling:
        return self

    def take_step_timings(self) -> list[StepSample]:
        """The engine's steps in wall seconds (simulated seconds / speedup)."""
        return [dataclasses.replace(s, seconds=s.seconds / self._speedup) for s in self.engine.take_step_timings()]

    async def _run(self) -> None:
        engine = self.engine
        while True:
            seconds = engine.begin_step()
            if seconds is None:
                self._wake.clear()
                if engine.has_work:  # queued work that cannot run yet (its blocks are pinned for a peer): look again soon
                    try:
                        await asyncio.wait_for(self._wake.wait(), IDLE_POLL_S)
                    except TimeoutError:
                        pass
                else:
                    await self._wake.wait()
                continue
            await asyncio.sleep(seconds / self._speedup)
            engine.end_step()

    def _on_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._failure = f"the sim engine's step loop died: {task.exception()!r}"
            log.error("%s", self._failure)
