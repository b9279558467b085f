"""Simulated workers: a sim engine (dataplane/engines/sim) stepping in virtual time, and what its
agent would tell the control plane.

An agent reports its load every load_report_interval_s (0.2 s) and batches its KV events every
kv_event_interval_s (0.1 s) (dataplane/agent/config.py); a simulated worker does the same on the
same periods, each worker at its own phase (worker i of n starts i/n of a period in), and only
while something can change: an idle worker's report would repeat the last one. What it reports
becomes a WorkerView as the control plane builds it from the store (controlplane/cluster_state.py).

The step-time model the worker publishes (what the planner predicts with) is fitted once per
engine configuration, as `kvplane profile` would, from step times of the timing model over a grid
of step shapes (prefill chunks over several cached contexts, decode batches, and both mixed);
a real agent also refits online from the steps it runs.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvplane.apps.sim.clock import EventLoop
from kvplane.controlplane.core.index import ClearedEvent, KVEvent, RemovedEvent, StoredEvent
from kvplane.controlplane.core.views import WorkerLoadView, WorkerView
from kvplane.dataplane.engines import AllCleared, BlockRemoved, BlockStored, EngineOutput, EngineRequest, KVCacheEvent
from kvplane.dataplane.engines.sim import SimConfig, SimEngine
from kvplane.hardware import StepTiming
from kvplane.latency import StepSample, StepTimeModel, fit, prefill_attention
from kvplane.types import Role, WorkerId


@dataclass(frozen=True, slots=True)
class AgentTiming:
    """What an agent adds around its engine (defaults: dataplane/agent/config.py)."""

    load_report_interval_s: float = 0.2
    kv_event_interval_s: float = 0.1
    hop_s: float = 0.0005  # one RPC's one-way latency: client <-> control plane <-> agents
    import_wait_s: float = 10.0  # how long a full decode pool is waited on before prefilling locally

    def validate(self) -> AgentTiming:
        if self.load_report_interval_s <= 0 or self.kv_event_interval_s <= 0 or self.hop_s < 0 or self.import_wait_s < 0:
            raise ValueError(f"report intervals must be positive and the hop latency and import wait >= 0, got {self}")
        return self


@dataclass(slots=True)
class ImportWait:
    """A pull waiting for free blocks on a full decode pool (SimWorker.allocate_for_import)."""

    num_blocks: int
    ready: Callable[[list[int]], None]
    served: bool = False
    cancelled: bool = False


def index_events(events: Sequence[KVCacheEvent]) -> list[KVEvent]:
    """The engine's KV events as the cache index takes them."""
    out: list[KVEvent] = []
    for e in events:
        if isinstance(e, BlockStored):
            out.append(StoredEvent(e.block_hashes, e.tier))
        elif isinstance(e, BlockRemoved):
            out.append(RemovedEvent(e.block_hashes, e.tier))
        elif isinstance(e, AllCleared):
            out.append(ClearedEvent())
    return out


def profile_samples(timing: StepTiming, config: SimConfig, max_context: int) -> list[StepSample]:
    """Step shapes a profile would cover, timed by the timing model."""
    chunk = config.max_num_batched_tokens
    lengths = sorted({max(1, int(chunk * f)) for f in (1 / 64, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1)})
    contexts = [c for c in (0, 1024, 4096, 16384) if c + chunk <= max_context] or [0]
    batches = sorted({b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= config.max_num_seqs} | {config.max_num_seqs})
    per_seq = [c for c in (256, 1024, 4096) if c < max_context] or [max_context // 2]
    samples = []

    def add(p: int, a: int, s: int, c: int) -> None:
        samples.append(StepSample(p, a, s, c, timing.step_seconds(p, a, s, c)))

    for n in lengths:
        for ctx in contexts:
            add(n, prefill_attention(n, ctx), 0, 0)
    for b in batches:
        for ctx in per_seq:
            add(0, 0, b, b * ctx)
            add(min(chunk - b, chunk // 4), prefill_attention(min(chunk - b, chunk // 4), 0), b, b * ctx)
    return samples


@functools.cache
def _fitted(key: tuple) -> StepTimeModel | None:
    timing, config, max_context = key[0], key[1], key[2]
    return fit(profile_samples(timing, config, max_context), seeded_from_profile=True)


def fitted_step_model(timing: StepTiming, config: SimConfig, max_context: int) -> StepTimeModel:
    model = _fitted((timing, _ConfigKey.of(config), max_context))
    if model is None:
        raise ValueError("the profile grid gave too few step shapes to fit a step-time model")
    return model


@dataclass(frozen=True, slots=True)
class _ConfigKey:
    """The config fields a profile depends on (SimConfig itself is mutable, so not hashable)."""

    max_num_batched_tokens: int
    max_num_seqs: int

    @classmethod
    def of(cls, config: SimConfig) -> _ConfigKey:
        return cls(config.max_num_batched_tokens, config.max_num_seqs)


class SimWorker:
    """One simulated worker: its engine, its step loop, its reports."""

    def __init__(
        self,
        worker_id: WorkerId,
        role: Role,
        engine: SimEngine,
        loop: EventLoop,
        timing: AgentTiming,
        phase: float,
        latency: StepTimeModel,
        on_report: Callable[[SimWorker], None],
        on_kv_events: Callable[[SimWorker, list[KVEvent]], None],
    ) -> None:
        self.worker_id = worker_id
        self.role = role
        self.engine = engine
        self._loop = loop
        self._timing = timing
        self._phase = phase  # 0..1: where in each period this worker reports
        self._latency = latency
        self._on_report = on_report
        self._on_kv_events = on_kv_events
        self._stepping = False
        self._wake_at = -1.0  # the kick armed for a lower-tier copy's first layer
        self._report_armed = False
        self._events_armed = False
        self._kv_seq = 0
        self._imports: deque[ImportWait] = deque()  # pulls waiting for blocks, first come first served
        self.view = self._make_view()
        # Work done here, for the load spread: prompt tokens computed and tokens generated.
        self.num_prefill_tokens = 0
        self.num_generated_tokens = 0
        self.peak_used_blocks = 0  # the most KV blocks in use any report showed
        self.busy_s = 0.0  # seconds of steps
        self.prefill_busy_s = 0.0  # of those, steps that computed prompt tokens

    # -- requests -------------------------------------------------------------------------------
    def submit(self, request: EngineRequest, sink: Callable[[EngineOutput], None]) -> None:
        self.engine.submit(request, sink)  # raises before queueing when the request cannot run
        self.kick()

    def allocate_for_import(self, num_blocks: int, ready: Callable[[list[int]], None]) -> ImportWait:
        """Blocks to pull `num_blocks` into, handed to `ready` now or, when the pool is full, once
        steps or released pins free them: the agent waits for memory as vLLM and SGLang decode
        workers do. Waiting pulls are served first come first served, before the engine's own
        queue takes freed blocks: their prompt is computed and holds the prefill worker's blocks
        (serving them in arrival order with the engine's queue measured worse: the pulls waited
        behind a long local prompt's reservation). The agent differs here: it looks again every
        IMPORT_POLL_S (5 ms), so the engine's own queue, seated at each step's end, may take
        freed blocks first. Cancel the wait returned to give up."""
        wait = ImportWait(num_blocks, ready)
        self._imports.append(wait)
        self._serve_imports()
        return wait

    def _serve_imports(self) -> None:
        while self._imports:
            wait = self._imports[0]
            if not wait.cancelled:
                dst = self.engine.allocate_for_import(wait.num_blocks)
                if dst is None:
                    return
                wait.served = True
                wait.ready(dst)
            self._imports.popleft()

    def kick(self) -> None:
        """Starts the next step if none runs; arms the reports (something may have changed)."""
        self._arm()
        self._serve_imports()  # blocks freed since go to waiting pulls before the engine's queue
        if self._stepping:
            return
        seconds = self.engine.begin_step()
        if seconds is not None:
            self.busy_s += seconds
            if self.engine.last_features[0]:
                self.prefill_busy_s += seconds
            self._stepping = True
            self._loop.after(seconds, self._end_step)
            return
        wake = self.engine.next_ready_at()  # a request waits for its KV copy from a lower tier
        if wake is not None and wake != self._wake_at:
            self._wake_at = wake
            self._loop.at(wake, self.kick)

    def _end_step(self) -> None:
        self._stepping = False
        self.engine.end_step()
        self.kick()

    # -- reports ----------------------------------------------------------------------------------
    def _next_tick(self, period: float) -> float:
        now = self._loop.now
        k = math.floor(now / period - self._phase) + 1
        while (k + self._phase) * period <= now:  # float rounding at a tick must not repeat it
            k += 1
        return (k + self._phase) * period

    def _arm(self) -> None:
        if not self._report_armed:
            self._report_armed = True
            self._loop.at(self._next_tick(self._timing.load_report_interval_s), self._report)
        if not self._events_armed:
            self._events_armed = True
            self._loop.at(self._next_tick(self._timing.kv_event_interval_s), self._publish_events)

    def _report(self) -> None:
        self.view = self._make_view()
        self._on_report(self)
        load = self.view.load
        self.peak_used_blocks = max(self.peak_used_blocks, load.num_used_blocks)
        if self.engine.has_work or load.num_running or load.num_waiting or self._stepping:
            self._loop.at(self._next_tick(self._timing.load_report_interval_s), self._report)
        else:
            self._report_armed = False

    def _publish_events(self) -> None:
        events = self.engine.take_kv_events()
        if events:
            self._kv_seq += 1
            self._on_kv_events(self, index_events(events))
            self._loop.at(self._next_tick(self._timing.kv_event_interval_s), self._publish_events)
        else:
            self._events_armed = False

    @property
    def kv_seq(self) -> int:
        return self._kv_seq

    def _make_view(self) -> WorkerView:
        load = self.engine.load()
        info = self.engine.info
        return WorkerView(
            worker_id=self.worker_id,
            role=self.role,
            model=info.model,
            block_size=info.layout.block_size,
            active=True,
            load=WorkerLoadView(
                num_running=load.num_running,
                num_waiting=load.num_waiting,
                num_queued_prefill_tokens=load.num_queued_prefill_tokens,
                num_free_blocks=load.num_free_blocks,
                num_used_blocks=load.num_used_blocks,
                num_total_blocks=load.num_total_blocks,
                running_remaining_tokens=load.running_remaining_tokens,
                running_context_tokens=load.running_context_tokens,
            ),
            max_context=info.max_context,
            block_nbytes=info.layout.block_nbytes,
            latency=self._latency,
            chunk_tokens=info.max_num_batched_tokens,
            max_num_seqs=info.max_num_seqs,
        )
