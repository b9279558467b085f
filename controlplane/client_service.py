"""The client-facing Kvplane service: validate, route, admit, then run the request on its workers.

Nothing is lost: a request either streams to completion or its caller gets a status saying why
it failed. A decode worker that fails before the first token is retried once elsewhere.
"""
from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass

import grpc

from controlplane import keys
from controlplane.cluster_state import ClusterState
from controlplane.config import ControlPlaneConfig
from controlplane.batch_queue import BatchQueue
from controlplane.core.admission import (
    Admit,
    AdmissionPolicy,
    PlacementOption,
    Reject,
    admission_policy_names,
    make_admission_policy,
)
from controlplane.core.predictor import Calibration, Prediction, blocks_to_transfer, predict, tpot_recovery_s
from controlplane.core.router import NoCandidateError, RouteDecision, RouteRequest, Router
from controlplane.core.settings import PRIORITIES, SettingError, validate_setting
from controlplane.observe import RequestObservation, record_admission
from controlplane.store.base import Store, StoreError
from kvplane import tickets
from kvplane.convert import disagg_from_pb, layout_from_pb
from kvplane.errors import rejection_trailers
from kvplane.grpc_util import aio_channel
from kvplane.telemetry import tracing
from kvplane.telemetry.window import StatsWindow
from kvplane.types import DisaggMode, Tier, WorkerId
from kvplane.v1 import agent_pb2, agent_pb2_grpc, client_pb2, client_pb2_grpc

log = logging.getLogger(__name__)

LINK_RATE_EWMA = 0.2  # weight of the newest measured transfer rate



@dataclass(slots=True)
class Validated:
    """A request that passed validation, tokenized once for every routing attempt."""

    request_id: str
    model: str
    token_ids: list[int]
    route: RouteRequest
    priority: str


@dataclass(slots=True)
class Plan:
    decision: RouteDecision
    prefill_worker: WorkerId | None     # None: prefill on the decode worker
    decode_worker: WorkerId
    prediction: Prediction | None
    options: tuple[PlacementOption, ...]  # every placement considered, the router's first

    @property
    def disaggregated(self) -> bool:
        return self.prefill_worker is not None

    @property
    def fetch_from(self) -> str | None:
        """The router's fetch, when admission kept the router's placement."""
        d = self.decision
        follows = self.decode_worker == d.decode_worker and self.prefill_worker == d.prefill_worker
        return d.fetch_from if follows else None


class AgentStubs:
    """One channel per agent endpoint, reused across requests."""

    def __init__(self) -> None:
        self._stubs: dict[str, agent_pb2_grpc.AgentStub] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, endpoint: str) -> agent_pb2_grpc.AgentStub:
        stub = self._stubs.get(endpoint)
        if stub is None:
            channel = aio_channel(endpoint)
            self._channels[endpoint] = channel
            stub = self._stubs[endpoint] = agent_pb2_grpc.AgentStub(channel)
        return stub

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


class ClientService(client_pb2_grpc.KvplaneServicer):
    def __init__(self, state: ClusterState, store: Store, config: ControlPlaneConfig, ticket_key: bytes, stubs: AgentStubs) -> None:
        self._state = state
        self._store = store
        self._config = config
        self._ticket_key = ticket_key
        self._stubs = stubs
        self._router = Router(config.router)
        state.kv_stored_listeners.append(self._router.on_kv_stored)
        state.worker_removed_listeners.append(self._router.on_worker_removed)
        self._policies: dict[str, AdmissionPolicy] = {}
        self._batch_queue = BatchQueue(config.batch_queue_size)
        self._link_bytes_per_s = config.initial_link_gb_per_s * 1e9
        self._calibration = Calibration()
        self.stats_window = StatsWindow()  # recent per-worker request stats, served by GetStats
        self.metrics_url = ""

    # -- planning ------------------------------------------------------------------------------

    async def _validate(self, request: client_pb2.GenerateRequest, context) -> Validated:
        workers = self._state.workers
        if not workers:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no workers are registered with the control plane; start agents first")
        models = sorted({e.info.model for e in workers.values()})
        model = request.model or (models[0] if len(models) == 1 else "")
        if not model:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"model is required: this cluster serves {models}")
        if model not in models:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown model {model!r}: this cluster serves {models}")
        priority = request.priority or PRIORITIES[0]
        if priority not in PRIORITIES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"priority must be one of {list(PRIORITIES)}, got {priority!r}")
        limits = next(e.info for e in workers.values() if e.info.model == model)
        s = request.sampling
        if s.max_tokens == 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sampling.max_tokens must be at least 1")
        if s.max_tokens > limits.max_tokens_limit:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.max_tokens {s.max_tokens} is above this model's limit of {limits.max_tokens_limit}")
        if s.temperature < 0 or not 0 <= s.top_p <= 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "temperature must be >= 0 and top_p within [0, 1]")
        token_ids = await self._prompt_tokens(request, model, workers, context)
        bad = next((t for t in token_ids if t >= limits.vocab_size), None)
        if bad is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"token id {bad} is outside the vocabulary of {model!r} (size {limits.vocab_size})")
        if len(token_ids) + s.max_tokens > limits.max_context:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"prompt of {len(token_ids)} tokens plus max_tokens {s.max_tokens} exceeds the context of {limits.max_context} tokens",
            )
        try:
            disagg = disagg_from_pb(request.disagg)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        route = RouteRequest(model=model, prompt_token_ids=token_ids, max_tokens=s.max_tokens, disagg=disagg, cache_salt=request.cache_salt)
        return Validated(request.request_id or uuid.uuid4().hex, model, token_ids, route, priority)

    def _policy(self) -> AdmissionPolicy:
        """The admission policy in force: a run-time setting wins over the start-up flag."""
        name = self._state.settings.admission_policy(self._config.admission.policy)
        policy = self._policies.get(name)
        if policy is None:
            policy = self._policies[name] = make_admission_policy(dataclasses.replace(self._config.admission, policy=name))
        return policy

    def _decide(self, v: Validated, exclude: frozenset[str], count: bool = False) -> Plan | Reject:
        """Routes and admits; raises NoCandidateError when nothing can serve the model.
        `count`: record the admission decision in metrics (Generate does; Route runs nothing)."""
        views = [w for w in self._state.views() if w.worker_id not in exclude]
        with tracing.span(tracing.SPAN_ROUTE) as span:
            decision = self._router.route(v.route, views, self._state.index)
            if span.is_recording():
                span.set_attributes(_route_attributes(decision))
        candidates = [w for w in views if w.model == v.model and w.active and w.role.can_decode]
        options = self._options(v, decision, candidates)
        objective = self._state.settings.objective(v.model, v.priority)
        policy_name = self._state.settings.admission_policy(self._config.admission.policy)
        policy = self._policy()
        with tracing.span(tracing.SPAN_ADMISSION):
            verdict = policy.decide(v.route, candidates, options, objective)
            record_admission(verdict, policy_name, count=count)
        if isinstance(verdict, Reject):
            return verdict
        chosen = verdict.option or options[0]
        prefill = chosen.prefill_worker if chosen.disaggregated else None
        return Plan(decision, prefill, chosen.decode_worker, chosen.prediction, tuple(options))

    def _admissible(self, v: Validated, plan: Plan) -> dict[WorkerId, bool]:
        """Per decode candidate, whether the admission policy alone would take it (for Route)."""
        policy = self._policy()
        objective = self._state.settings.objective(v.model, v.priority)
        by_decode = {o.decode_worker: o for o in plan.options[1:]}
        candidates = [w for w in self._state.views() if w.worker_id in {c.worker_id for c in plan.decision.candidates}]
        return {
            w.worker_id: isinstance(policy.decide(v.route, [w], [by_decode.get(w.worker_id, plan.options[0])], objective), Admit)
            for w in candidates
        }

    def _options(self, v: Validated, decision: RouteDecision, candidates) -> list[PlacementOption]:
        """Placements best first: the router's choice, then every other decode candidate by cost
        (prefilling where the router's choice does), each with a latency prediction."""
        first = PlacementOption(decision.decode_worker, decision.prefill_worker or decision.decode_worker)
        order = [c.worker_id for c in decision.candidates if c.worker_id != decision.decode_worker]
        others = [
            PlacementOption(w, first.prefill_worker if first.disaggregated and first.prefill_worker != w else w)
            for w in order
        ]
        # The router already hashed the prompt; one index walk serves every option.
        hashes = decision.block_hashes
        held = {w: o.num_blocks for w, o in self._state.index.overlaps(hashes).items()} if hashes else {}
        return [self._with_prediction(v, o, held) for o in [first, *others]]

    def _with_prediction(self, v: Validated, option: PlacementOption, held: dict[WorkerId, int]) -> PlacementOption:
        """`held`: leading prompt blocks each worker holds."""
        decode, prefill = self._state.perf(option.decode_worker), self._state.perf(option.prefill_worker)
        if decode is None or prefill is None:
            return option
        prompt = len(v.token_ids)
        prefill_cached = min(held.get(option.prefill_worker, 0), (prompt - 1) // decode.block_size) * decode.block_size
        transfer_bytes = 0
        if option.disaggregated:
            entry = self._state.workers[option.decode_worker]
            block_nbytes = layout_from_pb(entry.info.layout).block_nbytes
            transfer_bytes = blocks_to_transfer(prompt, decode.block_size, held.get(option.decode_worker, 0)) * block_nbytes
        prediction = predict(
            prompt_tokens=prompt,
            max_tokens=v.route.max_tokens,
            prefill_cached_tokens=prefill_cached,
            prefill=prefill,
            decode=decode,
            transfer_bytes=transfer_bytes,
            link_bytes_per_s=self._link_bytes_per_s,
        )
        if prediction is not None:
            prediction = self._calibration.apply(prediction, _ttft_kind(option.disaggregated), "tpot")
        objective = self._state.settings.objective(v.model, v.priority)
        recovery = tpot_recovery_s(decode, objective.tpot_ms / 1000 - self._calibration.offset("tpot"), prompt, v.route.max_tokens)
        return dataclasses.replace(option, prediction=prediction, tpot_recovery_s=recovery)

    async def _reject(self, context, verdict: Reject) -> None:
        context.set_trailing_metadata(rejection_trailers(verdict.retry_after_s, verdict.reason))
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"rejected at admission: {verdict.reason}; retry after {verdict.retry_after_s:.1f} s",
        )

    async def _plan(self, v: Validated, context, exclude: frozenset[str] = frozenset()) -> tuple[Plan, float]:
        """Routes and admits, letting a batch request wait in the queue; returns the plan and the
        seconds it waited. Aborts the call on rejection."""
        waiter = None
        started = time.monotonic()
        try:
            while True:
                try:
                    verdict = self._decide(v, exclude, count=True)
                except NoCandidateError as e:
                    code = grpc.StatusCode.FAILED_PRECONDITION if v.route.disagg is DisaggMode.ALWAYS else grpc.StatusCode.UNAVAILABLE
                    await context.abort(code, str(e))
                held_back = v.priority == "batch" and self._batch_queue.interactive_pressure()
                if isinstance(verdict, Plan) and not held_back:
                    return verdict, time.monotonic() - started
                if v.priority != "batch":
                    self._batch_queue.interactive_rejected()
                    await self._reject(context, verdict)
                if waiter is None:
                    waiter = self._batch_queue.enter()
                    if waiter is None:
                        await self._reject(context, Reject(f"batch queue full ({self._batch_queue.capacity} waiting); " + _reason_of(verdict), _retry_of(verdict)))
                if waiter.shed_reason:
                    await self._reject(context, Reject(waiter.shed_reason, _retry_of(verdict)))
                if time.monotonic() - started > self._config.batch_queue_timeout_s:
                    await self._reject(context, Reject(f"waited {self._config.batch_queue_timeout_s:.0f} s in the batch queue; " + _reason_of(verdict), _retry_of(verdict)))
                await self._batch_queue.wait(waiter, self._config.batch_poll_s)
        finally:
            if waiter is not None:
                self._batch_queue.leave(waiter)

    async def _prompt_tokens(self, request, model: str, workers, context) -> list[int]:
        kind = request.WhichOneof("prompt")
        if kind == "token_ids":
            ids = list(request.token_ids.ids)
        elif kind == "text" and request.text:
            ids = await self._tokenize(request.text, [e.info.endpoint for e in workers.values() if e.info.model == model], context)
        else:
            ids = []
        if not ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty: send text or token_ids")
        return ids

    async def _tokenize(self, text: str, endpoints: list[str], context) -> list[int]:
        """Tokenizes on a worker of the model (replicas load no tokenizer), trying each in turn."""
        failures = []
        for endpoint in endpoints:
            try:
                reply = await self._stubs.get(endpoint).Tokenize(agent_pb2.TokenizeRequest(text=text), timeout=10)
                return list(reply.token_ids)
            except grpc.aio.AioRpcError as e:
                failures.append(f"{endpoint}: {e.details()}")
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"no worker could tokenize the prompt ({'; '.join(failures)})")

    # -- RPCs --------------------------------------------------------------------------------

    async def Route(self, request: client_pb2.GenerateRequest, context):
        v = await self._validate(request, context)
        try:
            verdict = self._decide(v, frozenset())
        except NoCandidateError as e:
            code = grpc.StatusCode.FAILED_PRECONDITION if v.route.disagg is DisaggMode.ALWAYS else grpc.StatusCode.UNAVAILABLE
            await context.abort(code, str(e))
        if isinstance(verdict, Reject):
            await self._reject(context, verdict)
        return _route_response(v, verdict, self._admissible(v, verdict))

    async def Generate(self, request: client_pb2.GenerateRequest, context):
        started = time.monotonic()
        v = await self._validate(request, context)
        observation = RequestObservation(self.stats_window)
        exclude: set[str] = set()
        for attempt in range(self._config.max_route_attempts):
            plan, queued_s = await self._plan(v, context, frozenset(exclude))
            d = plan.decision
            observation.routed(v.request_id, v.model, plan)
            decode = self._state.workers.get(plan.decode_worker)
            prefill = self._state.workers.get(plan.prefill_worker) if plan.prefill_worker else None
            # A fetch belongs to the router's own placement; admission may have chosen another.
            follows_router = plan.decode_worker == d.decode_worker and plan.prefill_worker == d.prefill_worker
            fetch = self._state.workers.get(d.fetch_from) if d.fetch_from and follows_router else None
            if decode is None or (plan.prefill_worker and prefill is None):
                exclude.add(plan.decode_worker)
                continue
            if follows_router:
                self._router.record(d)
            fetched = d.fetch_tokens if fetch is not None else 0
            cached = d.cached_tokens if follows_router else 0
            # New blocks only: a cached (or fetched) prefix is shared with the requests holding it.
            block_size = max(decode.info.layout.block_size, 1)
            num_blocks = -(-(d.prompt_tokens + request.sampling.max_tokens) // block_size) - (cached + fetched) // block_size
            routed = [(plan.decode_worker, 0 if prefill else d.prompt_tokens - cached - fetched, num_blocks)]
            if plan.prefill_worker:
                routed.append((plan.prefill_worker, d.prompt_tokens, 0))
            for worker_id, tokens, blocks in routed:
                self._state.note_routed(worker_id, tokens, blocks)
            source_id = plan.prefill_worker or (d.fetch_from if fetch is not None else "")
            agent_request = agent_pb2.AgentGenerateRequest(
                ticket=tickets.issue(self._ticket_key, v.request_id, plan.decode_worker, source_id or ""),
                request_id=v.request_id,
                prompt_token_ids=v.token_ids,
                sampling=request.sampling,
                cache_salt=request.cache_salt,
            )
            if prefill is not None:
                agent_request.prefill_from.CopyFrom(agent_pb2.PrefillSource(worker_id=plan.prefill_worker, endpoint=prefill.info.endpoint))
            elif fetch is not None:
                agent_request.prefill_from.CopyFrom(
                    agent_pb2.PrefillSource(worker_id=d.fetch_from, endpoint=fetch.info.endpoint, cached_only=True)
                )
            sent_any = False
            first_token_at: float | None = None
            last_token_at, num_tokens = 0.0, 0
            try:
                async for reply in self._stubs.get(decode.info.endpoint).Generate(agent_request):
                    if reply.token_ids:
                        last_token_at = time.monotonic()
                        if first_token_at is None:
                            first_token_at = last_token_at
                            self._prefilled(routed)
                        num_tokens += len(reply.token_ids)
                    observation.on_reply(len(reply.token_ids))
                    out = client_pb2.GenerateResponse(
                        token_ids=reply.token_ids,
                        text=reply.text,
                        finished=reply.finished,
                        finish_reason=reply.finish_reason,
                        request_id=v.request_id,
                    )
                    if reply.finished:
                        self._finish_metrics(out.metrics, reply.metrics, plan, v, queued_s, started, first_token_at)
                        if fetch is not None and not reply.metrics.kv_fetched_from:
                            out.metrics.route_reason += f" (the fetch from {d.fetch_from} failed; prefilled locally)"
                        if first_token_at is not None:
                            tpot_s = (last_token_at - first_token_at) / (num_tokens - 1) if num_tokens > 1 else None
                            self._learn(plan, first_token_at - started - queued_s, tpot_s)
                        observation.finished(out.metrics)
                    sent_any = True
                    yield out
                return
            except grpc.aio.AioRpcError as e:
                retryable = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if retryable and not sent_any and attempt + 1 < self._config.max_route_attempts:
                    log.warning("decode worker %s failed before the first token (%s); routing %s again", plan.decode_worker, e.code().name, v.request_id)
                    exclude.add(plan.decode_worker)
                    continue
                observation.failed(e.code().name)
                await context.abort(e.code(), f"worker {plan.decode_worker}: {e.details()}")
            finally:
                if first_token_at is None:  # failed, or the caller went away, before prefill ended
                    self._prefilled(routed)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "no worker could take the request; try again")

    def _prefilled(self, routed: list[tuple[WorkerId, int, int]]) -> None:
        for worker_id, tokens, _ in routed:
            self._state.note_prefilled(worker_id, tokens)

    def _learn(self, plan: Plan, ttft_s: float, tpot_s: float | None) -> None:
        """Feeds measured latencies back into the predictor's calibration."""
        p = plan.prediction
        if p is None:
            return
        # What was predicted before calibration: the residual is learnt against the raw model.
        self._calibration.observe(_ttft_kind(plan.prefill_worker is not None), p.ttft_s - p.ttft_offset_s, ttft_s)
        if tpot_s is not None:
            self._calibration.observe("tpot", p.tpot_s - p.tpot_offset_s, tpot_s)

    def _finish_metrics(self, out, agent_metrics, plan: Plan, v: Validated, queued_s: float, started: float, first_token_at: float | None) -> None:
        out.CopyFrom(agent_metrics)
        out.route_reason = plan.decision.reason
        out.priority = v.priority
        out.queued_ms = queued_s * 1000
        if plan.prediction is not None:
            out.predicted_ttft_ms = plan.prediction.ttft_ms
            out.predicted_tpot_ms = plan.prediction.tpot_ms
        if first_token_at is not None:
            # TTFT as the caller sees it: admission, queueing and routing included.
            out.ttft_ms = (first_token_at - started) * 1000
        if agent_metrics.kv_transfer_bytes and agent_metrics.kv_transfer_ms > 0:
            measured = agent_metrics.kv_transfer_bytes / (agent_metrics.kv_transfer_ms / 1000)
            self._link_bytes_per_s += LINK_RATE_EWMA * (measured - self._link_bytes_per_s)

    async def GetStats(self, request, context):
        window = self.stats_window
        reply = client_pb2.GetStatsResponse(window_s=min(request.window_s or window.horizon_s, window.horizon_s), metrics_url=self.metrics_url)
        for s in window.stats(request.window_s or None):
            reply.workers.add(
                worker_id=s.worker_id, num_requests=s.num_requests, ttft=_summary_pb(s.ttft_s), itl=_summary_pb(s.itl_s),
                prompt_tokens=s.prompt_tokens, cached_tokens=s.cached_tokens, kv_transfer_bytes=s.kv_transfer_bytes,
            )  # fmt: skip
        return reply

    async def ListWorkers(self, request, context):
        now = time.monotonic()
        reply = client_pb2.ListWorkersResponse()
        for worker_id in sorted(self._state.workers):
            e = self._state.workers[worker_id]
            status = reply.workers.add()
            status.info.CopyFrom(e.info)
            status.info.state = e.state
            status.load.CopyFrom(e.load)
            status.load_age_s = now - e.load_at
        return reply

    async def GetCache(self, request, context):
        reply = client_pb2.GetCacheResponse()
        by_tier = self._state.index.blocks_by_tier()
        for worker_id in sorted(set(self._state.workers) | set(by_tier)):
            wc = reply.workers.add(worker_id=worker_id)
            for tier in Tier:
                wc.blocks_by_tier[tier.value] = by_tier.get(WorkerId(worker_id), {}).get(tier, 0)
        return reply

    async def ProfileWorker(self, request: client_pb2.ProfileWorkerRequest, context):
        entry = await self._worker_or_abort(request.worker_id, context)
        try:
            reply = await self._stubs.get(entry.info.endpoint).Profile(
                agent_pb2.ProfileRequest(max_prompt_tokens=request.max_prompt_tokens, max_batch=request.max_batch), timeout=300
            )
        except grpc.aio.AioRpcError as e:
            await context.abort(e.code(), f"profiling {request.worker_id} failed: {e.details()}")
        try:
            await self._store.put(keys.profile_key(request.worker_id), reply.profile.SerializeToString())
        except StoreError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"profile measured but not stored: {e}")
        return client_pb2.ProfileWorkerResponse(worker_id=request.worker_id, model=reply.model, num_samples=len(reply.profile.samples))

    async def GetConfig(self, request, context):
        return await self._config_response(context)

    async def SetConfig(self, request: client_pb2.SetConfigRequest, context):
        try:
            if request.value:
                validate_setting(request.key, request.value, admission_policy_names)
                await self._store.put(keys.setting_key(request.key), request.value.encode())
            else:
                await self._store.delete(keys.setting_key(request.key))
        except SettingError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except StoreError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {e}")
        return await self._config_response(context)

    async def _config_response(self, context) -> client_pb2.ConfigResponse:
        # Read from the store, not this replica's view, so the answer includes the write just made.
        try:
            items, _ = await self._store.get_prefix(keys.SETTINGS)
        except StoreError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {e}")
        return client_pb2.ConfigResponse(values={kv.key[len(keys.SETTINGS):]: kv.value.decode() for kv in items})

    async def _worker_or_abort(self, worker_id: str, context):
        entry = self._state.workers.get(WorkerId(worker_id))
        if entry is None:
            known = ", ".join(sorted(self._state.workers)) or "none"
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no worker {worker_id!r}; registered workers: {known}")
        return entry

    async def DrainWorker(self, request, context):
        entry = await self._worker_or_abort(request.worker_id, context)
        try:
            reply = await self._stubs.get(entry.info.endpoint).Drain(agent_pb2.DrainRequest(), timeout=10)
        except grpc.aio.AioRpcError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"draining {request.worker_id} failed: {e.details()}")
        entry.state = reply.state
        return client_pb2.DrainWorkerResponse(worker_id=request.worker_id, state=reply.state)


def _route_response(v: Validated, plan: Plan, admissible: dict[WorkerId, bool]) -> client_pb2.RouteResponse:
    d = plan.decision
    reply = client_pb2.RouteResponse(
        request_id=v.request_id,
        decode_worker=plan.decode_worker,
        prefill_worker=plan.prefill_worker or "",
        disaggregated=plan.prefill_worker is not None,
        reason=d.reason,
        prompt_tokens=d.prompt_tokens,
        cached_tokens=d.cached_tokens,
        fetch_from=d.fetch_from or "",
    )
    for c in d.candidates:
        reply.candidates.add(
            worker_id=c.worker_id, cost=c.cost, cached_tokens=c.cached_tokens, admissible=admissible.get(c.worker_id, False), note=c.note
        )
    return reply


def _summary_pb(s) -> client_pb2.LatencySummary:
    return client_pb2.LatencySummary(count=s.count, mean_ms=s.mean * 1000, p50_ms=s.p50 * 1000, p90_ms=s.p90 * 1000, p99_ms=s.p99 * 1000)


def _route_attributes(d: RouteDecision) -> dict:
    return {
        "kvplane.route.decode_worker": d.decode_worker,
        "kvplane.route.prefill_worker": d.prefill_worker or d.decode_worker,
        "kvplane.route.disaggregated": d.disaggregated,
        "kvplane.route.reason": d.reason,
        "kvplane.prompt.tokens": d.prompt_tokens,
        "kvplane.prompt.cached_tokens": d.cached_tokens,
        "kvplane.route.num_candidates": len(d.candidates),
    }


def _ttft_kind(disaggregated: bool) -> str:
    return "ttft-disaggregated" if disaggregated else "ttft-local"


def _reason_of(verdict: Plan | Reject) -> str:
    return verdict.reason if isinstance(verdict, Reject) else "held back while interactive requests are being rejected"


def _retry_of(verdict: Plan | Reject) -> float:
    return verdict.retry_after_s if isinstance(verdict, Reject) else 1.0
