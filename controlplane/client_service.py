"""The client-facing Kvplane service: validate, route, admit, then run the request on its workers.

Nothing is lost: a request either streams to completion or its caller gets a status saying why
it failed. A decode worker that fails before the first token is retried once elsewhere.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

import grpc

from controlplane.cluster_state import ClusterState
from controlplane.config import ControlPlaneConfig
from controlplane.core.admission import Reject, make_admission_policy
from controlplane.core.router import NoCandidateError, RouteDecision, RouteRequest, Router
from kvplane import tickets
from kvplane.convert import disagg_from_pb
from kvplane.errors import rejection_trailers
from kvplane.grpc_util import aio_channel
from kvplane.types import DisaggMode, Tier, WorkerId
from kvplane.v1 import agent_pb2, agent_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

log = logging.getLogger(__name__)



@dataclass(slots=True)
class Plan:
    request_id: str
    model: str
    token_ids: list[int]
    decision: RouteDecision
    admissible: dict[WorkerId, bool]  # per decode candidate, by the admission policy alone


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
    def __init__(self, state: ClusterState, config: ControlPlaneConfig, ticket_key: bytes, stubs: AgentStubs) -> None:
        self._state = state
        self._config = config
        self._ticket_key = ticket_key
        self._stubs = stubs
        self._router = Router(config.router)
        state.kv_stored_listeners.append(self._router.on_kv_stored)
        state.worker_removed_listeners.append(self._router.on_worker_removed)
        self._admission = make_admission_policy(config.admission)

    # -- planning ------------------------------------------------------------------------------

    async def _plan(self, request: client_pb2.GenerateRequest, context, exclude: frozenset[str] = frozenset()) -> Plan:
        workers = {wid: e for wid, e in self._state.workers.items() if wid not in exclude}
        if not workers:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no workers are registered with the control plane; start agents first")
        models = sorted({e.info.model for e in workers.values()})
        model = request.model or (models[0] if len(models) == 1 else "")
        if not model:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"model is required: this cluster serves {models}")
        if model not in models:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown model {model!r}: this cluster serves {models}")
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
        route_request = RouteRequest(model=model, prompt_token_ids=token_ids, max_tokens=s.max_tokens, disagg=disagg, cache_salt=request.cache_salt)
        views = [v for v in self._state.views() if v.worker_id not in exclude]
        try:
            decision = self._router.route(route_request, views, self._state.index)
        except NoCandidateError as e:
            code = grpc.StatusCode.FAILED_PRECONDITION if disagg is DisaggMode.ALWAYS else grpc.StatusCode.UNAVAILABLE
            await context.abort(code, str(e))
        candidates = [v for v in views if v.model == model and v.active and v.role.can_decode]
        verdict = self._admission.decide(route_request, candidates)
        if isinstance(verdict, Reject):
            context.set_trailing_metadata(rejection_trailers(verdict.retry_after_s, verdict.reason))
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"rejected at admission: {verdict.reason}; retry after {verdict.retry_after_s:.1f} s",
            )
        admissible = {v.worker_id: not isinstance(self._admission.decide(route_request, [v]), Reject) for v in candidates}
        return Plan(request.request_id or uuid.uuid4().hex, model, token_ids, decision, admissible)

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
        plan = await self._plan(request, context)
        return _route_response(plan)

    async def Generate(self, request: client_pb2.GenerateRequest, context):
        started = time.monotonic()
        exclude: set[str] = set()
        for attempt in range(self._config.max_route_attempts):
            plan = await self._plan(request, context, frozenset(exclude))
            d = plan.decision
            decode = self._state.workers.get(d.decode_worker)
            prefill = self._state.workers.get(d.prefill_worker) if d.prefill_worker else None
            fetch = self._state.workers.get(d.fetch_from) if d.fetch_from else None
            if decode is None or (d.prefill_worker and prefill is None):
                exclude.add(d.decode_worker)
                continue
            self._router.record(d)
            fetched = d.fetch_tokens if fetch is not None else 0
            # New blocks only: a cached (or fetched) prefix is shared with the requests holding it.
            block_size = max(decode.info.layout.block_size, 1)
            num_blocks = -(-(d.prompt_tokens + request.sampling.max_tokens) // block_size) - (d.cached_tokens + fetched) // block_size
            self._state.note_routed(
                d.decode_worker, 0 if d.disaggregated else d.prompt_tokens - d.cached_tokens - fetched, num_blocks
            )
            if d.prefill_worker:
                self._state.note_routed(d.prefill_worker, d.prompt_tokens)
            source_id = d.prefill_worker or (d.fetch_from if fetch is not None else "")
            agent_request = agent_pb2.AgentGenerateRequest(
                ticket=tickets.issue(self._ticket_key, plan.request_id, d.decode_worker, source_id or ""),
                request_id=plan.request_id,
                prompt_token_ids=plan.token_ids,
                sampling=request.sampling,
                cache_salt=request.cache_salt,
            )
            if prefill is not None:
                agent_request.prefill_from.CopyFrom(
                    agent_pb2.PrefillSource(worker_id=d.prefill_worker, endpoint=prefill.info.endpoint)
                )
            elif fetch is not None:
                agent_request.prefill_from.CopyFrom(
                    agent_pb2.PrefillSource(worker_id=d.fetch_from, endpoint=fetch.info.endpoint, cached_only=True)
                )
            sent_any = False
            first_token_at: float | None = None
            try:
                async for reply in self._stubs.get(decode.info.endpoint).Generate(agent_request):
                    if reply.token_ids and first_token_at is None:
                        first_token_at = time.monotonic()
                    out = client_pb2.GenerateResponse(
                        token_ids=reply.token_ids,
                        text=reply.text,
                        finished=reply.finished,
                        finish_reason=reply.finish_reason,
                        request_id=plan.request_id,
                    )
                    if reply.finished:
                        out.metrics.CopyFrom(reply.metrics)
                        out.metrics.route_reason = d.reason
                        if fetch is not None and not reply.metrics.kv_fetched_from:
                            out.metrics.route_reason += f" (the fetch from {d.fetch_from} failed; prefilled locally)"
                        if first_token_at is not None:
                            # TTFT as the caller sees it: routing and admission included.
                            out.metrics.ttft_ms = (first_token_at - started) * 1000
                    sent_any = True
                    yield out
                return
            except grpc.aio.AioRpcError as e:
                retryable = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if retryable and not sent_any and attempt + 1 < self._config.max_route_attempts:
                    log.warning("decode worker %s failed before the first token (%s); routing %s again", d.decode_worker, e.code().name, plan.request_id)
                    exclude.add(d.decode_worker)
                    continue
                where = f"worker {d.decode_worker}"
                await context.abort(e.code(), f"{where}: {e.details()}")
        await context.abort(grpc.StatusCode.UNAVAILABLE, "no worker could take the request; try again")

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

    async def DrainWorker(self, request, context):
        entry = self._state.workers.get(WorkerId(request.worker_id))
        if entry is None:
            known = ", ".join(sorted(self._state.workers)) or "none"
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no worker {request.worker_id!r}; registered workers: {known}")
        try:
            reply = await self._stubs.get(entry.info.endpoint).Drain(agent_pb2.DrainRequest(), timeout=10)
        except grpc.aio.AioRpcError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"draining {request.worker_id} failed: {e.details()}")
        entry.state = reply.state
        return client_pb2.DrainWorkerResponse(worker_id=request.worker_id, state=reply.state)


def _route_response(plan: Plan) -> client_pb2.RouteResponse:
    d = plan.decision
    reply = client_pb2.RouteResponse(
        request_id=plan.request_id,
        decode_worker=d.decode_worker,
        prefill_worker=d.prefill_worker or "",
        disaggregated=d.disaggregated,
        reason=d.reason,
        prompt_tokens=d.prompt_tokens,
        cached_tokens=d.cached_tokens,
        fetch_from=d.fetch_from or "",
    )
    for c in d.candidates:
        reply.candidates.add(
            worker_id=c.worker_id, cost=c.cost, cached_tokens=c.cached_tokens, admissible=plan.admissible.get(c.worker_id, False), note=c.note
        )
    return reply
