"""The client-facing Kvplane service: validate, plan, then run the request on its workers.

Transport only: planning (route, predict, admit, fetch, load accounting) is the pure
controlplane.core.planner.Planner, which this service feeds with what happens to each request
(dispatched, first token, finished, measured latencies) and whose answers it turns into gRPC
status codes. It also holds batch requests in the batch queue, relays the agent's stream, records
metrics and serves the admin RPCs.

Nothing is lost: a request either streams to completion or its caller gets a status saying why
it failed. A decode worker that fails or stalls (relay.py's progress timeouts) before the first
token is routed around; after tokens were sent the request migrates to another worker and the
stream continues after them (core/failover.py); a stalled worker is taken out of routing.

Lookaside mode (lookaside.py): Route with `lookaside` plans and charges a request like Generate
(the same `_dispatch`) but hands the caller the agent request instead of relaying it; the
caller's Reports release the charge and, for a failure, get the next placement from the same
failover rules.

Security (docs/security.md): the AuthInterceptor has admitted the caller before any handler runs
(kvplane.security.auth.caller()). The cache salt of a request is derived from the caller's tenant
with the cluster's secret salt key (a client salt only narrows it), so Route, metrics and cache
hits only ever see the caller's own tenant's blocks, and nobody can compute another tenant's. Every agent call carries a ticket signed for exactly that call (a migrated
request's too, for its resumed prompt). Prompt text is bounded before anything else happens, and
no message echoes unbounded input.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from kvplane import tickets
from kvplane.chat import ChatTemplateError
from kvplane.controlplane import keys
from kvplane.controlplane.batch_queue import BatchQueue
from kvplane.controlplane.cluster_state import ClusterState, WorkerEntry
from kvplane.controlplane.config import ControlPlaneConfig
from kvplane.controlplane.core import failover
from kvplane.controlplane.core.admission_base import Reject, RejectKind
from kvplane.controlplane.core.failover import Failure
from kvplane.controlplane.core.planner import EARLY_TPOT_TOKENS, Outcome, Plan, Planner, Routed
from kvplane.controlplane.core.routing import NoCandidateError, NoPrefillWorkerError, RouteDecision, RouteRequest
from kvplane.controlplane.core.settings import SettingError, validate_setting
from kvplane.controlplane.lookaside import LookasideBook, Placed, new_placement_id, unknown_placement
from kvplane.controlplane.observe import (
    PHASE_ADMIT,
    PHASE_RELAY,
    PHASE_REPORT,
    PHASE_ROUTE,
    RequestObservation,
    cpu_seconds,
    record_admission,
    record_migration,
    record_planning,
    register_cpu_counter,
)
from kvplane.controlplane.relay import WorkerFailed, agent_stream, coalesced
from kvplane.controlplane.store.base import Store, StoreError
from kvplane.controlplane.tokenizer import ModelTokenizer, PromptTokenizer, TokenizerError
from kvplane.convert import disagg_from_pb
from kvplane.errors import ERROR_KIND_KEY, UNKNOWN_MODEL, component_trailers, rejection_trailers
from kvplane.grpc_util import aio_channel
from kvplane.sampling import sampling_problem
from kvplane.security.auth import caller
from kvplane.security.credentials import Credentials
from kvplane.security.identity import ANONYMOUS, Identity, Role, tenant_cache_salt
from kvplane.security.limits import MAX_ID_CHARS, MAX_STREAM_INTERVAL, clip
from kvplane.telemetry import grpc_tracing, instruments, tracing
from kvplane.telemetry.window import StatsWindow
from kvplane.types import PRIORITIES, Tier, WorkerId
from kvplane.v1 import agent_pb2, agent_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

log = logging.getLogger(__name__)

LOOKASIDE_OUTCOME = "kvplane.lookaside.outcome"
REPORT_METHOD = "/kvplane.v1.Kvplane/Report"  # what a report on ReportStream is traced as
LOOKASIDE_OUTCOMES = ("finished", "cancelled", "failed", "moved", "expired")
DEADLINE_SLACK_S = 0.05  # an agent call failing this close to the caller's deadline failed because of it


@dataclass(slots=True)
class Validated:
    """A request that passed validation, tokenized once for every planning attempt."""

    request_id: str
    route: RouteRequest  # its cache_salt is the tenant-derived one
    tenant: str
    # The model's tokenizer here, which detokenizes a relayed answer; None: the agent does.
    tokenizer: ModelTokenizer | None = None


@dataclass(slots=True)
class Attempt:
    """One planned and charged attempt of a request: where it runs and what the agent gets."""

    plan: Plan
    endpoint: str  # the decode agent's
    fetch: WorkerEntry | None  # the holder a cached prefix is pulled from, if the plan fetches
    dispatch_id: int
    agent_request: agent_pb2.AgentGenerateRequest
    queued_s: float  # time it waited in the batch queue (0 for a migration)


class AgentStubs:
    """One channel per agent (worker id and endpoint), reused across requests. Each channel
    verifies that the server's certificate names that worker (Credentials.for_peer), so a request
    and its ticket go only to the worker the plan chose, not to whoever answers at its address."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials
        self._stubs: dict[tuple[str, str], agent_pb2_grpc.AgentStub] = {}
        self._channels: dict[tuple[str, str], grpc.aio.Channel] = {}

    def get(self, worker_id: str, endpoint: str) -> agent_pb2_grpc.AgentStub:
        key = (worker_id, endpoint)
        stub = self._stubs.get(key)
        if stub is None:
            channel = aio_channel(endpoint, self._credentials.for_peer(Identity(Role.WORKER, worker_id)))
            self._channels[key] = channel
            stub = self._stubs[key] = agent_pb2_grpc.AgentStub(channel)
        return stub

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


class ClientService(client_pb2_grpc.KvplaneServicer):
    def __init__(
        self,
        state: ClusterState,
        store: Store,
        config: ControlPlaneConfig,
        signer: tickets.TicketSigner,
        stubs: AgentStubs,
        prompt_tokenizer: PromptTokenizer | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        cache_salt_key: bytes,
    ) -> None:
        self._state = state
        self._store = store
        self._config = config
        self._signer = signer
        self._cache_salt_key = cache_salt_key  # the cluster's (secrets.py): tenants' salts are secret
        self._stubs = stubs
        self._tokenizer = prompt_tokenizer or PromptTokenizer()
        self._served: tuple[int, dict] = (-1, {})  # (ClusterState.workers_generation, _served_models())
        self._clock = clock
        self.planner = Planner(config.planner)
        state.kv_stored_listeners.append(self.planner.kv_stored)
        state.load_reported_listeners.append(self.planner.load_reported)
        state.worker_removed_listeners.append(self.planner.worker_removed)
        self._batch_queue = BatchQueue(config.batch_queue_size, config.batch_queue_timeout_s, config.batch_poll_s, clock=clock)
        self.stats_window = StatsWindow()  # recent per-worker request stats, served by GetStats
        self._lookaside = LookasideBook(clock)  # requests placed for callers to run (lookaside mode)
        for failure in (Failure.WORKER, Failure.STALLED):
            record_migration(failure.value, count=0)
        for outcome in LOOKASIDE_OUTCOMES:  # declared at 0, so that a scrape shows them before the first
            instruments().kvplane_lookaside_placements.add(0, {LOOKASIDE_OUTCOME: outcome})
        register_cpu_counter()
        self.metrics_url = ""

    # -- validation ----------------------------------------------------------------------------

    async def _validate(self, request: client_pb2.GenerateRequest, context) -> Validated:
        if request.WhichOneof("prompt") == "text":
            await self._check_prompt_size(request.text, context)
        elif request.WhichOneof("prompt") == "chat":
            await self._check_prompt_size("".join(m.role + m.content for m in request.chat.messages), context)
        if len(request.request_id) > MAX_ID_CHARS or len(request.cache_salt) > 256 or len(request.model) > 256:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"request_id is at most {MAX_ID_CHARS} characters, cache_salt and model at most 256"
            )
        served = self._served_models()
        if not served:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no workers are registered with the control plane; start agents first")
        models = sorted(served)
        model = request.model or (models[0] if len(models) == 1 else "")
        if not model:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"model is required: this cluster serves {models}")
        if model not in models:
            context.set_trailing_metadata(((ERROR_KIND_KEY, UNKNOWN_MODEL),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown model {clip(model)}: this cluster serves {models}")
        priority = request.priority or PRIORITIES[0]
        if priority not in PRIORITIES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"priority must be one of {list(PRIORITIES)}, got {clip(priority)}")
        if request.stream_interval > MAX_STREAM_INTERVAL:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"stream_interval is at most {MAX_STREAM_INTERVAL} tokens, got {request.stream_interval}"
            )
        limits, tokenizer = served[model]
        s = request.sampling
        if s.max_tokens == 0 and not request.max_tokens_to_limit:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sampling.max_tokens must be at least 1")
        if s.max_tokens > limits.max_tokens_limit:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"sampling.max_tokens {s.max_tokens} is above this model's limit of {limits.max_tokens_limit}",
            )
        problem = sampling_problem(s.temperature, s.top_p, s.top_k)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.{problem}")
        token_ids = await self._prompt_tokens(request, model, tokenizer, context)
        if token_ids and max(token_ids) >= limits.vocab_size:  # max() in C; the generator only to name the id
            bad = next(t for t in token_ids if t >= limits.vocab_size)
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"token id {bad} is outside the vocabulary of {model!r} (size {limits.vocab_size})"
            )
        if s.max_tokens == 0:  # max_tokens_to_limit: as many as the model allows after this prompt
            room = min(limits.max_tokens_limit, limits.max_context - len(token_ids))
            if room < 1:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"prompt of {len(token_ids)} tokens fills the context of {limits.max_context} tokens: no room for an answer",
                )
            s.max_tokens = room
        if len(token_ids) + s.max_tokens > limits.max_context:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"prompt of {len(token_ids)} tokens plus max_tokens {s.max_tokens} exceeds the context of {limits.max_context} tokens",
            )
        try:
            disagg = disagg_from_pb(request.disagg)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        identity = caller() or ANONYMOUS
        route = RouteRequest(
            model=model, prompt_token_ids=token_ids, max_tokens=s.max_tokens, disagg=disagg,
            cache_salt=tenant_cache_salt(identity, request.cache_salt, key=self._cache_salt_key), priority=priority,
        )  # fmt: skip
        return Validated(
            request.request_id or uuid.uuid4().hex, route, identity.cache_tenant,
            tokenizer if isinstance(tokenizer, ModelTokenizer) else None,
        )  # fmt: skip

    def _served_models(self) -> dict[str, tuple[common_pb2.WorkerInfo, ModelTokenizer | str]]:
        """model -> (the info of its first worker: the model's limits; its tokenizer here, or why
        it has none: token ids still work, and the agent detokenizes). Derived from every worker's
        info, so redone only when workers join, leave or change (ClusterState.workers_generation),
        not per request: a pass over 1,000 workers' infos costs ~0.2 ms. The why is kept as text:
        an exception object raised again per request would keep every raise's frames alive."""
        generation = self._state.workers_generation
        if self._served[0] != generation:
            infos = [e.info for e in self._state.workers.values()]
            first: dict[str, common_pb2.WorkerInfo] = {}
            for info in infos:
                first.setdefault(info.model, info)
            served: dict[str, tuple[common_pb2.WorkerInfo, ModelTokenizer | str]] = {}
            for model, info in first.items():
                try:
                    served[model] = (info, self._tokenizer.for_model(model, infos))
                except TokenizerError as e:
                    served[model] = (info, str(e))
            self._served = (generation, served)
        return self._served[1]

    async def _check_prompt_size(self, text: str, context) -> None:
        """Bounds prompt text before any work: len() is free, and UTF-8 bytes >= characters."""
        limit = self._config.max_prompt_bytes
        if len(text) > limit or (len(text) * 4 > limit and len(text.encode("utf-8", "surrogatepass")) > limit):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the prompt text is larger than this cluster's limit of {limit} bytes")

    async def _prompt_tokens(self, request, model: str, tokenizer: ModelTokenizer | str, context) -> list[int]:
        """The prompt's token ids, tokenized here (controlplane/tokenizer.py) with `tokenizer`, or
        refused with why there is none: no worker is sent client text, so none sees a prompt that
        is not routed to it, nor can rewrite one."""
        kind = request.WhichOneof("prompt")
        ids: list[int] = []
        if kind == "token_ids":
            ids = list(request.token_ids.ids)
        elif (kind == "text" and request.text) or (kind == "chat" and request.chat.messages):
            try:
                if not isinstance(tokenizer, ModelTokenizer):
                    raise TokenizerError(tokenizer)
                if kind == "text":
                    ids = await self._tokenizer.encode_text(tokenizer, request.text)
                else:
                    messages = [{"role": m.role, "content": m.content} for m in request.chat.messages]
                    ids = await self._tokenizer.encode_chat(tokenizer, model, messages)
            except (TokenizerError, ChatTemplateError) as e:
                # The same for every retry: the deployment or the request must change.
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        if not ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty: send text, token_ids or chat messages")
        return ids

    # -- planning: the planner's answers as status codes -------------------------------------------

    async def _route(self, v: Validated, context, exclude: frozenset[str] = frozenset()) -> Routed:
        """The planner's routing step, in its span; aborts when no worker can take the request."""
        settings = self._state.settings
        with tracing.span(tracing.SPAN_ROUTE) as span:
            try:
                routed = self.planner.route(v.route, self._state.view().without(exclude), settings, self._clock())
            except NoCandidateError as e:
                # FAILED_PRECONDITION only when the deployment lacks what `always` needs; workers
                # that exist but are out for now (failed this request, stalled) are worth a retry.
                permanent = isinstance(e, NoPrefillWorkerError) and not (e.transient or exclude)
                failed = f" (left out after failing this request: {', '.join(sorted(exclude))}; retry later)" if exclude else ""
                context.set_trailing_metadata(component_trailers("controlplane"))
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION if permanent else grpc.StatusCode.UNAVAILABLE, f"{e}{failed}")
            if span.is_recording():
                span.set_attributes(_route_attributes(routed.decision))
        return routed

    async def _decide(
        self, v: Validated, context, exclude: frozenset[str] = frozenset(), count: bool = False
    ) -> tuple[Routed, Plan | Reject]:
        """Routes and admits. `count`: record the admission decision in metrics (Generate does;
        Route runs nothing)."""
        started, cpu = time.perf_counter(), time.thread_time()
        routed = await self._route(v, context, exclude)
        routed_cpu = time.thread_time()
        settings = self._state.settings
        with tracing.span(tracing.SPAN_ADMISSION):
            verdict = self.planner.admit(routed, settings)
            record_admission(verdict, self.planner.admission_policy_name(settings), count=count)
        cpu_seconds[PHASE_ROUTE] += routed_cpu - cpu
        cpu_seconds[PHASE_ADMIT] += time.thread_time() - routed_cpu
        record_planning(time.perf_counter() - started)
        return routed, verdict

    async def _reject(self, context, verdict: Reject) -> None:
        context.set_trailing_metadata(rejection_trailers(verdict.retry_after_s, verdict.reason))
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"rejected at admission: {verdict.reason}; retry after {verdict.retry_after_s:.1f} s",
        )

    async def _plan(self, v: Validated, context, exclude: frozenset[str] = frozenset()) -> tuple[Plan, float]:
        """Plans, letting a batch request wait in the batch queue; returns the plan and the
        seconds it waited. Aborts the call on rejection."""
        queue = self._batch_queue
        batch = v.route.priority == "batch"
        waiter = None
        started = self._clock()
        try:
            while True:
                _, verdict = await self._decide(v, context, exclude, count=True)
                held_back = batch and queue.interactive_pressure()
                if isinstance(verdict, Plan) and not held_back:
                    return verdict, self._clock() - started
                if not batch:
                    queue.interactive_rejected()
                    await self._reject(context, verdict)
                if waiter is None:
                    waiter = queue.enter()
                    if waiter is None:
                        await self._reject(context, _queue_reject(f"batch queue full ({queue.capacity} waiting)", verdict))
                if waiter.shed_reason:
                    await self._reject(context, _queue_reject(waiter.shed_reason, verdict, keep_reason=False))
                if queue.expired(waiter):
                    await self._reject(context, _queue_reject(f"waited {queue.timeout_s:.0f} s in the batch queue", verdict))
                await queue.wait(waiter)
        finally:
            if waiter is not None:
                queue.leave(waiter)

    # -- RPCs --------------------------------------------------------------------------------

    async def Route(self, request: client_pb2.GenerateRequest, context):
        v = await self._validate(request, context)
        if request.lookaside:
            return await self._place_lookaside(v, request, context)
        routed, verdict = await self._decide(v, context)
        if isinstance(verdict, Reject):
            await self._reject(context, verdict)
        now = self._clock()
        discount_of = functools.partial(self.planner.trust.excess_s, now=now)
        return _route_response(v, verdict, self.planner.admissible(routed, self._state.settings), discount_of)

    async def Generate(self, request: client_pb2.GenerateRequest, context):
        """Plans and relays the request. A decode worker that fails (dies, stalls, drains) before
        the first token is routed around; after tokens were sent the request migrates to another
        worker and the stream continues after them (core/failover.py decides which)."""
        started = self._clock()
        v = await self._validate(request, context)
        observation = RequestObservation(self.stats_window)
        limits = self._config.failover
        sent: list[int] = list(request.resume_token_ids)  # every token the caller has
        resumed_by_caller = bool(sent)
        if len(sent) > v.route.max_tokens:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"resume_token_ids has {len(sent)} tokens, more than max_tokens {v.route.max_tokens}: resume only what this request generated",
            )
        if len(sent) == v.route.max_tokens:
            # The caller has every token; only the end was lost with the replica that relayed it.
            yield client_pb2.GenerateResponse(finished=True, finish_reason="length", request_id=v.request_id)
            return
        # The answer's text, made here from its tokens when this replica has the model's
        # tokenizer (the agents then send ids only); else the agent's text is relayed.
        text = v.tokenizer.text_stream() if v.tokenizer is not None else None
        if text is not None:
            await text.start_after(v.route.prompt_token_ids, sent)
        exclude: set[str] = set()
        num_attempts = num_migrations = 0
        queued_s = 0.0
        first_token_at: float | None = None
        last_token_at, num_new_tokens = 0.0, 0
        migrating = False
        while True:
            time_left = context.time_remaining()
            if time_left is not None and time_left <= 0:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the request's deadline passed while it was being moved")
            num_attempts += 1
            attempt = await self._dispatch(
                v, request, sent, exclude, migrating, observation, context, tokens_only=text is not None, report_prefill_done=True
            )
            plan, fetch, dispatch = attempt.plan, attempt.fetch, attempt.dispatch_id
            if not migrating:
                queued_s = attempt.queued_s
            try:
                async for reply in coalesced(agent_stream(
                    self._stubs.get(plan.decode_worker, attempt.endpoint), attempt.agent_request, plan.decode_worker,
                    time_left_s=context.time_remaining(),
                    first_token_timeout_s=self._config.first_token_timeout_s, token_timeout_s=self._config.token_timeout_s,
                    paused_since=self._state.pauses.paused_since,
                )):  # fmt: skip
                    relay_cpu = time.thread_time()  # this message's relay work, up to handing it to gRPC
                    if reply.remote_prefill_done:
                        self.planner.remote_prefill_ended(dispatch, self._clock())
                        if not reply.token_ids and not reply.finished:
                            continue  # news for this replica alone
                    if reply.token_ids:
                        last_token_at = self._clock()
                        if num_new_tokens == 0:
                            self.planner.prefill_ended(dispatch, last_token_at)
                        if first_token_at is None:
                            first_token_at = last_token_at
                        before = num_new_tokens
                        num_new_tokens += len(reply.token_ids)
                        sent.extend(reply.token_ids)
                        if (
                            before < EARLY_TPOT_TOKENS <= num_new_tokens
                            and not reply.finished
                            and num_migrations == 0
                            and not resumed_by_caller
                        ):
                            # The TPOT measured so far calibrates admission now, not when it ends.
                            self.planner.decoding(dispatch, last_token_at, (last_token_at - first_token_at) / (num_new_tokens - 1))
                    observation.on_reply(len(reply.token_ids))
                    out = client_pb2.GenerateResponse(
                        token_ids=reply.token_ids,
                        text=reply.text if text is None else await text.push(reply.token_ids, final=reply.finished),
                        finished=reply.finished,
                        finish_reason=reply.finish_reason,
                        request_id=v.request_id,
                    )
                    if reply.finished:
                        self._finish_metrics(out.metrics, reply.metrics, plan, v, queued_s, started, first_token_at)
                        out.metrics.prompt_tokens = len(v.route.prompt_token_ids)
                        out.metrics.num_migrations = num_migrations
                        if fetch is not None and not reply.metrics.kv_fetched_from:
                            out.metrics.route_reason += f" (the fetch from {plan.fetch_from} failed; prefilled locally)"
                        outcome = None
                        if num_migrations == 0 and not resumed_by_caller:  # a moved request measured two workers
                            outcome = Outcome(
                                ttft_s=first_token_at - started - queued_s if first_token_at is not None else None,
                                tpot_s=(last_token_at - first_token_at) / (num_new_tokens - 1) if num_new_tokens > 1 else None,
                                kv_transfer_bytes=reply.metrics.kv_transfer_bytes,
                                kv_transfer_s=reply.metrics.kv_transfer_ms / 1000,
                            )
                        # Released before the caller sees the end, so its next request finds the worker free.
                        self.planner.finished(dispatch, self._clock(), outcome)
                        self._state.answered(plan, [*v.route.prompt_token_ids, *sent])
                        observation.finished(out.metrics)
                    cpu_seconds[PHASE_RELAY] += time.thread_time() - relay_cpu
                    yield out
                return
            except WorkerFailed as e:
                time_left = context.time_remaining()
                if time_left is not None and time_left <= DEADLINE_SLACK_S:
                    # The caller's own deadline ended the agent's call: not the worker's fault.
                    observation.failed("DEADLINE_EXCEEDED")
                    await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"the request's deadline passed on decode worker {e.worker_id}")
                if e.failure is Failure.STALLED:
                    self.planner.worker_stalled(WorkerId(e.worker_id), self._clock())
                elif e.failure is Failure.WORKER:
                    self.planner.worker_failed(WorkerId(e.worker_id), self._clock())
                step = failover.next_step(e.failure, len(sent), num_attempts, num_migrations, limits)
                if step is failover.Step.FAIL:
                    observation.failed(e.code.name)
                    await self._fail(context, e, len(sent), num_migrations)
                log.warning(
                    "decode worker %s failed %s (%s); %s %s", e.worker_id,
                    f"after {len(sent)} tokens" if sent else "before the first token", e.details, step.value, v.request_id,
                )  # fmt: skip
                exclude.add(e.worker_id)
                if step is failover.Step.MIGRATE:
                    num_migrations += 1
                    migrating = True
                    record_migration(e.failure.value)
                    if len(sent) >= v.route.max_tokens:  # the last token arrived, the end did not
                        rest = "" if text is None else await text.push((), final=True)
                        yield client_pb2.GenerateResponse(text=rest, finished=True, finish_reason="length", request_id=v.request_id)
                        return
            finally:
                # Failed, moved, or the caller went away: release what it was charged with (idempotent).
                self.planner.finished(dispatch, self._clock())

    async def _dispatch(
        self, v: Validated, request: client_pb2.GenerateRequest, sent: list[int], exclude: set[str], migrating: bool,
        observation: RequestObservation, context, *, tokens_only: bool = False, report_prefill_done: bool = False,
    ) -> Attempt:  # fmt: skip
        """Plans one attempt of the request after the tokens `sent` (admitted, unless migrating:
        it was admitted already), charges its workers and builds its agent request with a fresh
        ticket (`tokens_only`: the agent sends no text; `report_prefill_done`: it says when a remote
        prefill has ended). Aborts the call when no worker can take it."""
        route = failover.resumed(v.route, sent) if sent else v.route
        while True:
            queued_s = 0.0
            if migrating:
                plan = await self._place(route, context, frozenset(exclude))
            else:
                plan, queued_s = await self._plan(Validated(v.request_id, route, v.tenant), context, frozenset(exclude))
            decode = self._state.workers.get(plan.decode_worker)
            prefill = self._state.workers.get(plan.prefill_worker) if plan.prefill_worker else None
            if decode is not None and (not plan.prefill_worker or prefill is not None):
                break
            exclude.add(plan.decode_worker)  # it left since planning
        fetch = self._state.workers.get(plan.fetch_from) if plan.fetch_from else None
        if plan.fetch_from and fetch is None:
            plan = plan.without_fetch()  # the holder left since planning
        observation.routed(v.request_id, v.route.model, plan)
        dispatch_id = self.planner.dispatched(plan, self._clock())
        self._state.routed(plan)  # the index credits these workers with the prompt's blocks
        agent_request = self._agent_request(v, request, plan, route, prefill, fetch, num_resumed=len(sent), tokens_only=tokens_only)
        agent_request.report_prefill_done = report_prefill_done and prefill is not None  # not a field the ticket binds
        return Attempt(plan, decode.info.endpoint, fetch, dispatch_id, agent_request, queued_s)

    def _agent_request(
        self, v: Validated, request: client_pb2.GenerateRequest, plan: Plan, route: RouteRequest, prefill, fetch, num_resumed: int,
        tokens_only: bool,
    ) -> agent_pb2.AgentGenerateRequest:  # fmt: skip
        agent_request = agent_pb2.AgentGenerateRequest(
            request_id=v.request_id,
            prompt_token_ids=route.prompt_token_ids,
            sampling=request.sampling,
            cache_salt=route.cache_salt,
            num_resumed_tokens=num_resumed,
            stream_interval=request.stream_interval,
            tokens_only=tokens_only,
        )
        agent_request.sampling.max_tokens = route.max_tokens  # what is left of it after a resume
        if prefill is not None:
            agent_request.prefill_from.CopyFrom(agent_pb2.PrefillSource(worker_id=plan.prefill_worker, endpoint=prefill.info.endpoint))
        elif fetch is not None:
            agent_request.prefill_from.CopyFrom(
                agent_pb2.PrefillSource(worker_id=plan.fetch_from, endpoint=fetch.info.endpoint, cached_only=True)
            )
        # A fresh ticket per attempt, bound to this attempt's prompt (a migrated request's carries
        # the tokens already sent), the tenant's salt, the peer and the sampling as admitted: a
        # lookaside caller holds this request before it runs it, and can change none of them.
        agent_request.ticket.CopyFrom(self._signer.issue_generate(agent_request, plan.decode_worker, tenant=v.tenant))
        return agent_request

    # -- lookaside mode: the caller runs the request on its agent and reports back ----------------

    async def _place_lookaside(self, v: Validated, request: client_pb2.GenerateRequest, context) -> client_pb2.RouteResponse:
        """Admits and charges the request as Generate would and answers with its Placement."""
        self._expire_lookaside()
        sent = list(request.resume_token_ids)
        if len(sent) >= v.route.max_tokens:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"resume_token_ids has {len(sent)} tokens of max_tokens {v.route.max_tokens}: nothing is left to generate",
            )
        placed = Placed(
            placement_id=new_placement_id(), owner=(caller() or ANONYMOUS).key, validated=v, request=request,
            started=self._clock(), observation=RequestObservation(self.stats_window), sent=sent, resumed_by_caller=bool(sent),
        )  # fmt: skip
        return client_pb2.RouteResponse(
            request_id=v.request_id, placement=await self._lookaside_attempt(placed, migrating=False, context=context),
            **_decision_fields(placed.plan),
        )  # fmt: skip

    async def _lookaside_attempt(self, placed: Placed, migrating: bool, context) -> client_pb2.Placement:
        """Plans, charges and books one attempt of a placed request; its Placement."""
        v = placed.validated
        placed.num_attempts += 1
        attempt = await self._dispatch(v, placed.request, placed.sent, placed.exclude, migrating, placed.observation, context)
        placed.plan, placed.dispatch_id, placed.first_token = attempt.plan, attempt.dispatch_id, False
        if not migrating:
            placed.queued_s = attempt.queued_s
        ticket = attempt.agent_request.ticket
        placed.expires_at = self._clock() + (ticket.expires_at - ticket.issued_at) + self._config.first_token_timeout_s
        self._lookaside.add(placed)
        placement = client_pb2.Placement(
            placement_id=placed.placement_id, worker_id=attempt.plan.decode_worker, endpoint=attempt.endpoint,
            agent_request=attempt.agent_request.SerializeToString(), ticket_expires_in_s=max(ticket.expires_at - time.time(), 0.0),
            first_token_timeout_s=self._config.first_token_timeout_s, token_timeout_s=self._config.token_timeout_s,
            num_resumed_tokens=len(placed.sent),
        )  # fmt: skip
        self._finish_metrics(placement.metrics, common_pb2.RequestMetrics(), attempt.plan, v, placed.queued_s, placed.started, None)
        placement.metrics.prompt_tokens = len(v.route.prompt_token_ids)
        placement.metrics.num_migrations = placed.num_migrations
        return placement

    async def Report(self, request: client_pb2.ReportRequest, context):
        """What became of a placed request: release its charge as Generate would at that point,
        learn from its timings, and for a failure decide (core/failover.py) where it continues."""
        cpu = time.thread_time()
        try:
            return await self._report(request, context)
        finally:
            cpu_seconds[PHASE_REPORT] += time.thread_time() - cpu  # a failure's re-planning included

    async def ReportStream(self, request_iterator, context):
        """Report's FIRST_TOKEN, PREFILL_DONE, FINISHED and CANCELLED on one stream, an answer each, in order;
        a report's error is its answer's, and the stream goes on."""
        owner = (caller() or ANONYMOUS).key
        async for request in request_iterator:
            cpu = time.thread_time()
            with grpc_tracing.message_span(REPORT_METHOD, request.traceparent) as status:
                code, message = self._settle(request, owner)
                status(code)
            cpu_seconds[PHASE_REPORT] += time.thread_time() - cpu
            yield client_pb2.ReportAnswer(placement_id=request.placement_id, code=code.value[0], message=message)

    async def _report(self, request: client_pb2.ReportRequest, context) -> client_pb2.ReportResponse:
        owner = (caller() or ANONYMOUS).key
        if request.event != client_pb2.ReportRequest.FAILED:
            code, message = self._settle(request, owner)
            if code is not grpc.StatusCode.OK:
                await context.abort(code, message)
            return client_pb2.ReportResponse()
        self._expire_lookaside()
        placed = self._lookaside.take(request.placement_id, owner)
        if placed is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, unknown_placement(request.placement_id))
        self._lookaside.pop(placed.placement_id)
        self.planner.finished(placed.dispatch_id, self._clock())
        return await self._lookaside_failed(placed, request, context)

    def _settle(self, request: client_pb2.ReportRequest, owner: str) -> tuple[grpc.StatusCode, str]:
        """A report that never waits, so that a stream answers its reports in order: FAILED, whose
        answer is a placement found by planning again, is Report's alone (_report)."""
        self._expire_lookaside()
        placed = self._lookaside.take(request.placement_id, owner)
        if placed is None:
            return grpc.StatusCode.NOT_FOUND, unknown_placement(request.placement_id)
        now = self._clock()
        events = client_pb2.ReportRequest
        if request.event == events.FIRST_TOKEN:
            if not placed.first_token:
                placed.first_token = True
                self.planner.prefill_ended(placed.dispatch_id, now)
                placed.observation.on_reply(1)
                placed.expires_at = now + self._config.token_timeout_s * max(placed.validated.route.max_tokens - len(placed.sent), 1)
            return grpc.StatusCode.OK, ""
        if request.event == events.PREFILL_DONE:
            self.planner.remote_prefill_ended(placed.dispatch_id, now)  # no-op unless prefilled remotely
            return grpc.StatusCode.OK, ""
        if request.event == events.FAILED:
            return grpc.StatusCode.FAILED_PRECONDITION, "send FAILED with Report: its answer is where the request continues"
        if request.event not in (events.FINISHED, events.CANCELLED):
            return grpc.StatusCode.INVALID_ARGUMENT, "event must be FIRST_TOKEN, PREFILL_DONE, FINISHED, FAILED or CANCELLED"
        self._lookaside.pop(placed.placement_id)
        if request.event == events.FINISHED:
            self._lookaside_finished(placed, request, now)
            return grpc.StatusCode.OK, ""
        self.planner.finished(placed.dispatch_id, now)
        placed.observation.failed("CANCELLED")
        instruments().kvplane_lookaside_placements.add(1, {LOOKASIDE_OUTCOME: "cancelled"})
        return grpc.StatusCode.OK, ""

    def _lookaside_finished(self, placed: Placed, request: client_pb2.ReportRequest, now: float) -> None:
        outcome = None
        if placed.num_migrations == 0 and not placed.resumed_by_caller:  # a moved request measured two workers
            outcome = Outcome(
                ttft_s=request.ttft_ms / 1000 - placed.queued_s if request.ttft_ms > 0 else None,
                tpot_s=request.tpot_ms / 1000 if request.tpot_ms > 0 else None,
                kv_transfer_bytes=request.metrics.kv_transfer_bytes, kv_transfer_s=request.metrics.kv_transfer_ms / 1000,
            )  # fmt: skip
        self.planner.finished(placed.dispatch_id, now, outcome)
        placed.observation.tokens_reported(request.num_tokens, request.tpot_ms / 1000)
        placed.observation.finished(request.metrics)
        instruments().kvplane_lookaside_placements.add(1, {LOOKASIDE_OUTCOME: "finished"})

    async def _lookaside_failed(self, placed: Placed, request: client_pb2.ReportRequest, context) -> client_pb2.ReportResponse:
        v, worker_id = placed.validated, placed.plan.decode_worker
        sent = list(request.token_ids)
        if sent[: len(placed.sent)] != placed.sent or len(sent) > v.route.max_tokens:
            instruments().kvplane_lookaside_placements.add(1, {LOOKASIDE_OUTCOME: "failed"})
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "token_ids must be every token received for this request, starting with those it was placed after; the placement is released",
            )
        code = grpc.StatusCode.__members__.get(request.failure_code, grpc.StatusCode.UNAVAILABLE)
        failure = Failure.STALLED if request.stalled else failover.classify(code.name)
        if failure is Failure.STALLED:
            self.planner.worker_stalled(WorkerId(worker_id), self._clock())
        elif failure is Failure.WORKER:
            self.planner.worker_failed(WorkerId(worker_id), self._clock())
        step = failover.next_step(failure, len(sent), placed.num_attempts, placed.num_migrations, self._config.failover)
        details = request.failure_details[:200] or code.name
        if step is failover.Step.FAIL:
            placed.observation.failed(code.name)
            instruments().kvplane_lookaside_placements.add(1, {LOOKASIDE_OUTCOME: "failed"})
            await self._fail(context, WorkerFailed(worker_id, failure, code, details), len(sent), placed.num_migrations)
        log.warning("decode worker %s failed a lookaside request (%s); %s %s", worker_id, details, step.value, v.request_id)
        placed.exclude.add(worker_id)
        placed.sent = sent
        placed.placement_id = new_placement_id()  # a late report about the failed attempt names the old one
        if step is failover.Step.MIGRATE:
            placed.num_migrations += 1
            record_migration(failure.value)
            if len(sent) >= v.route.max_tokens:  # the caller has every token; only the end was lost
                instruments().kvplane_lookaside_placements.add(1, {LOOKASIDE_OUTCOME: "finished"})
                return client_pb2.ReportResponse()
        instruments().kvplane_lookaside_placements.add(1, {LOOKASIDE_OUTCOME: "moved"})
        return client_pb2.ReportResponse(next=await self._lookaside_attempt(placed, step is failover.Step.MIGRATE, context))

    def _expire_lookaside(self) -> None:
        """Releases what callers that stopped reporting were charged with (lookaside.py)."""
        for placed in self._lookaside.expired():
            log.warning("lookaside placement of %s expired without a report; its charge is released", placed.validated.request_id)
            self.planner.finished(placed.dispatch_id, self._clock())
            placed.observation.failed("EXPIRED")
            instruments().kvplane_lookaside_placements.add(1, {LOOKASIDE_OUTCOME: "expired"})

    async def _place(self, route: RouteRequest, context, exclude: frozenset[str]) -> Plan:
        """Where a migrating request goes: the router's choice, no admission (it was admitted)."""
        try:
            return self.planner.place(route, self._state.view().without(exclude), self._state.settings, self._clock())
        except NoCandidateError as e:
            context.set_trailing_metadata(component_trailers("controlplane"))
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"the request's decode worker failed ({', '.join(sorted(exclude))}) and no other can continue it: {e}",
            )

    async def _fail(self, context, e: WorkerFailed, num_sent: int, num_migrations: int) -> None:
        """Ends the call for a worker failure: UNAVAILABLE (retryable) unless the request itself
        failed; the message and a trailer name the worker, so nobody blames the control plane."""
        context.set_trailing_metadata(component_trailers(f"worker {e.worker_id}"))
        if e.failure is Failure.REQUEST:
            await context.abort(relayed_code(e.code), f"decode worker {e.worker_id} failed the request: {e.details}")
        where = f"after {num_sent} tokens" if num_sent else "before the first token"
        moved = f"; moved {num_migrations} times already (the limit)" if num_migrations else ""
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, f"decode worker {e.worker_id} failed {where} ({e.details}){moved}; retry the request"
        )

    def _finish_metrics(
        self, out, agent_metrics, plan: Plan, v: Validated, queued_s: float, started: float, first_token_at: float | None
    ) -> None:
        out.CopyFrom(agent_metrics)
        out.route_reason = plan.decision.reason
        out.priority = v.route.priority
        out.queued_ms = queued_s * 1000
        if plan.prediction is not None:
            out.predicted_ttft_ms = plan.prediction.ttft_ms
            out.predicted_tpot_ms = plan.prediction.tpot_ms
        if first_token_at is not None:
            # TTFT as the caller sees it: admission, queueing and routing included.
            out.ttft_ms = (first_token_at - started) * 1000

    async def GetStats(self, request, context):
        if not math.isfinite(request.window_s) or request.window_s < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "window_s must be a finite number of seconds >= 0")
        window = self.stats_window
        reply = client_pb2.GetStatsResponse(
            window_s=min(request.window_s or window.horizon_s, window.horizon_s), metrics_url=self.metrics_url
        )
        for s in window.stats(request.window_s or None):
            reply.workers.add(
                worker_id=s.worker_id, num_requests=s.num_requests, ttft=_summary_pb(s.ttft_s), itl=_summary_pb(s.itl_s),
                prompt_tokens=s.prompt_tokens, cached_tokens=s.cached_tokens, kv_transfer_bytes=s.kv_transfer_bytes,
            )  # fmt: skip
        return reply

    async def ListWorkers(self, request, context):
        now = time.monotonic()
        out = self.planner.health.excluded(self._state.view(), self._clock())
        reply = client_pb2.ListWorkersResponse()
        for worker_id in sorted(self._state.workers):
            e = self._state.workers[worker_id]
            status = reply.workers.add(out_of_routing=out.get(worker_id, ""))
            status.info.CopyFrom(e.info)
            status.info.state = e.state
            status.load.CopyFrom(e.load)
            status.load_age_s = now - e.load_at
        return reply

    async def GetCache(self, request, context):
        reply = client_pb2.GetCacheResponse()
        by_tier = self._state.index.blocks_by_tier()
        for worker_id in sorted(set(self._state.workers) | set(by_tier)):
            entry = self._state.workers.get(WorkerId(worker_id))
            wc = reply.workers.add(worker_id=worker_id, num_pinned_blocks=entry.load.num_pinned_blocks if entry else 0)
            for tier in Tier:
                wc.blocks_by_tier[tier.value] = by_tier.get(WorkerId(worker_id), {}).get(tier, 0)
        return reply

    async def ProfileWorker(self, request: client_pb2.ProfileWorkerRequest, context):
        entry = await self._worker_or_abort(request.worker_id, context)
        try:
            reply = await self._stubs.get(request.worker_id, entry.info.endpoint).Profile(
                agent_pb2.ProfileRequest(
                    max_prompt_tokens=request.max_prompt_tokens, max_batch=request.max_batch,
                    ticket=self._signer.issue(tickets.PROFILE, request.worker_id),
                ),
                timeout=300,
            )  # fmt: skip
        except grpc.aio.AioRpcError as e:
            context.set_trailing_metadata(component_trailers(f"worker {request.worker_id}"))
            await context.abort(relayed_code(e.code()), f"profiling {request.worker_id} failed: {e.details()}")
        try:
            await self._store.put(keys.profile_key(request.worker_id), reply.profile.SerializeToString())
        except StoreError as e:
            context.set_trailing_metadata(component_trailers("store"))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"profile measured but not stored: {e}")
        return client_pb2.ProfileWorkerResponse(worker_id=request.worker_id, model=reply.model, num_samples=len(reply.profile.samples))

    async def GetConfig(self, request, context):
        return await self._config_response(context)

    async def SetConfig(self, request: client_pb2.SetConfigRequest, context):
        if len(request.key) > 256 or len(request.value) > 256:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a setting's key and value are at most 256 characters each")
        try:
            if request.value:
                validate_setting(request.key, request.value)
                await self._store.put(keys.setting_key(request.key), request.value.encode())
            else:
                await self._store.delete(keys.setting_key(request.key))
        except SettingError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except StoreError as e:
            context.set_trailing_metadata(component_trailers("store"))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {e}")
        return await self._config_response(context)

    async def _config_response(self, context) -> client_pb2.ConfigResponse:
        # Read from the store, not this replica's view, so the answer includes the write just made.
        try:
            items, _ = await self._store.get_prefix(keys.SETTINGS)
        except StoreError as e:
            context.set_trailing_metadata(component_trailers("store"))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {e}")
        return client_pb2.ConfigResponse(values={kv.key[len(keys.SETTINGS) :]: kv.value.decode() for kv in items})

    async def _worker_or_abort(self, worker_id: str, context):
        entry = self._state.workers.get(WorkerId(worker_id))
        if entry is None:
            known = ", ".join(sorted(self._state.workers)[:20]) or "none"
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no worker {clip(worker_id)}; registered workers: {known}")
        return entry

    async def DrainWorker(self, request, context):
        return await self._set_draining(request.worker_id, True, context)

    async def UndrainWorker(self, request, context):
        return await self._set_draining(request.worker_id, False, context)

    async def _set_draining(self, worker_id: str, draining: bool, context) -> client_pb2.DrainWorkerResponse:
        entry = await self._worker_or_abort(worker_id, context)
        stub = self._stubs.get(worker_id, entry.info.endpoint)
        verb = "draining" if draining else "undraining"
        try:
            if draining:
                reply = await stub.Drain(agent_pb2.DrainRequest(ticket=self._signer.issue(tickets.DRAIN, worker_id)), timeout=10)
            else:
                reply = await stub.Undrain(agent_pb2.UndrainRequest(ticket=self._signer.issue(tickets.UNDRAIN, worker_id)), timeout=10)
        except grpc.aio.AioRpcError as e:
            context.set_trailing_metadata(component_trailers(f"worker {worker_id}"))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{verb} {worker_id} failed: {e.details()}")
        self._state.set_worker_state(WorkerId(worker_id), reply.state)
        return client_pb2.DrainWorkerResponse(worker_id=worker_id, state=reply.state)


def relayed_code(code: grpc.StatusCode) -> grpc.StatusCode:
    """An agent's status as this replica's: its auth failures are this replica's, not the caller's, fault."""
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNKNOWN):
        return grpc.StatusCode.UNAVAILABLE
    return code


def _decision_fields(plan: Plan) -> dict:
    """RouteResponse's fields for where `plan` runs and why (its candidates aside)."""
    d = plan.decision
    return dict(
        decode_worker=plan.decode_worker, prefill_worker=plan.prefill_worker or "", disaggregated=plan.prefill_worker is not None,
        reason=d.reason, prompt_tokens=d.prompt_tokens, cached_tokens=d.cached_tokens, fetch_from=d.fetch_from or "",
    )  # fmt: skip


def _route_response(
    v: Validated, plan: Plan, admissible: dict[WorkerId, bool], discount_of: Callable[[WorkerId], float]
) -> client_pb2.RouteResponse:
    """`discount_of`: seconds of queue the planner adds to a worker's reports (core/trust.py), said in its note."""
    d = plan.decision
    reply = client_pb2.RouteResponse(request_id=v.request_id, **_decision_fields(plan))
    for c in d.candidates:
        note, discount_s = c.note, discount_of(c.worker_id)
        if discount_s > 0:
            note += f"; its load reports discounted (+{discount_s:.2f} s of queue: its requests ran far past them)"
        reply.candidates.add(
            worker_id=c.worker_id, cost=c.cost, cached_tokens=c.cached_tokens, admissible=admissible.get(c.worker_id, False), note=note
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


def _queue_reject(why: str, verdict: Plan | Reject, keep_reason: bool = True) -> Reject:
    """A batch-queue rejection: why, then what admission said (a Plan: the request was held
    back for interactive traffic)."""
    if isinstance(verdict, Reject):
        reason, retry_after_s, kind = verdict.reason, verdict.retry_after_s, verdict.kind
    else:
        reason, retry_after_s, kind = "held back while interactive requests are being rejected", 1.0, RejectKind(0)
    return Reject(f"{why}; {reason}" if keep_reason else why, retry_after_s, kind | RejectKind.BATCH_QUEUE)
