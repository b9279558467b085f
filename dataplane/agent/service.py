"""The Agent gRPC service beside one engine: generate, prefill for a peer, serve KV pulls, drain.

Disaggregated request, decode side: ask the prefill peer to prefill and pin the prompt's full
blocks, pull only the blocks this engine lacks, commit them to the prefix cache, then run the
request here (the prefix cache hits; at most one block's tail is computed locally). If the peer
fails for any reason other than an incompatible layout, the request prefills locally instead,
as Dynamo does: the caller still gets its tokens.

Latency: the engine's step timings feed an online step-time model (kvplane.latency) that the link
reports with the load. Profile measures a seed for it by running synthetic requests through the
normal engine path (see dataplane/agent/profile.py).

Tickets (kvplane.tickets, docs/security.md): every call that runs work or touches KV carries a
ticket the control plane signed for it. Generate checks it is for this worker, this request id,
prompt and cache salt, this prefill source (worker, endpoint, fetch-only, transport) and this
sampling (at most the admitted max_tokens), and uses it once (a client calling it in lookaside
mode must be of the ticket's tenant); Prefill checks the same with this worker as the named
source (and, with mTLS, that the caller is a worker and the decode worker it names); PullKV and
ReleaseKV must carry the ticket their transfer was prefilled under, from that same worker.
Drain, Undrain and Profile need a ticket for that operation on this worker.

Peers are who the control plane says they are: with mTLS the decode side dials the prefill peer
(and pulls KV from it) on a channel that accepts only a certificate naming the worker the ticket
names (Credentials.for_peer), so neither a client's certificate nor another worker's can stand in
for it, wherever the endpoint leads.

The engine is reached only through the engine interface (dataplane/engines/base.py). Prefill,
KV pulls and remote prefill need its KV import/export capability, Profile its step timings; on
an engine without them those RPCs fail with FAILED_PRECONDITION and say so.

Engine-native disaggregation (an engine with the native KV transfer capability: SGLang, vLLM):
the same two steps, but the engines move the KV themselves. The decode agent asks the prefill
agent to prefill; the prefill agent's engine returns a handoff (its own parameters: vLLM's
kv_transfer_params, SGLang's bootstrap host/port/room), which comes back as the PrefillResponse's
transport descriptor; the decode agent passes it unchanged to its engine's generate. Nothing is
pinned or pulled by kvplane; the request's metrics still say what moved (blocks and bytes of the
prompt's KV, from the layout) and how long the handoff took until the first token.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from kvplane import tickets
from kvplane.convert import layout_from_pb, layout_to_pb, role_to_pb
from kvplane.dataplane.agent import profile
from kvplane.dataplane.agent.bridge import sampling_from_pb
from kvplane.dataplane.agent.config import AgentConfig
from kvplane.dataplane.agent.observe import PHASE_GENERATE, PHASE_PREFILL, EngineTimer, record_transfer
from kvplane.dataplane.engines.base import EngineAdapter, KVImportExport, NativeKVTransfer
from kvplane.dataplane.engines.request import EngineCapacityError, EngineInputError, EngineRequest, SamplingParams
from kvplane.dataplane.transport import LayoutMismatchError, PullSource, TransferError
from kvplane.dataplane.transport.grpc_stream import iter_chunks
from kvplane.dataplane.transport.integrity import KVIntegrityError, block_digests, check_imported
from kvplane.grpc_util import aio_channel
from kvplane.latency import OnlineStepModel, StepSample, StepTimeModel, fit, samples_from_pb, samples_to_pb
from kvplane.security.auth import caller
from kvplane.security.credentials import Credentials
from kvplane.security.identity import Identity, Role
from kvplane.security.limits import MAX_ID_CHARS, clip
from kvplane.telemetry import tracing
from kvplane.text_stream import TextStream
from kvplane.types import BlockHash
from kvplane.v1 import agent_pb2, agent_pb2_grpc, common_pb2

log = logging.getLogger(__name__)
MAX_EARLY_RELEASES = 4096  # releases remembered for prefills not pinned yet (ReleaseKV)

IMPORT_POLL_S = 0.005  # how often a pull waiting for free blocks looks again (an engine step frees them)
LATENCY_REFIT_INTERVAL_S = 1.0  # the online model refits at most this often (on the event loop)


@dataclass(slots=True)
class Pin:
    block_ids: list[int]
    expires_at: float
    nonce: bytes = b""  # of the ticket it was prefilled under: pulls and releases must present it
    puller: str = ""  # the decode worker that ticket names


class TransferReleased(Exception):
    """The puller released a transfer before it was pinned; the message is its id."""


class RemotePrefillRefused(Exception):
    """The prefill peer refused for a reason local prefill would not fix (e.g. layout mismatch)."""


class AgentService(agent_pb2_grpc.AgentServicer):
    def __init__(
        self,
        config: AgentConfig,
        engine: EngineAdapter,
        transports: dict,
        verifier: Callable[[], tickets.TicketVerifier],
        endpoint: str,
        clock: Callable[[], float] = time.time,
        *,
        credentials: Credentials,
    ) -> None:
        self._config = config
        self.endpoint = endpoint
        self._engine = engine
        self._kv: KVImportExport | None = engine.kv_transfer
        self._native: NativeKVTransfer | None = engine.native_transfer if self._kv is None else None
        self._transports = transports  # name -> KVTransport, best first; empty without self._kv
        self._clock = clock  # wall clock (seconds): pins expire by it, peers see expires_at
        self._verifier = verifier  # () -> TicketVerifier, with the public key registration returned
        self._credentials = credentials  # this worker's, for calls to peers
        self._replays = tickets.ReplayGuard()
        self.state = common_pb2.WORKER_STATE_ACTIVE
        self.metrics_url = ""  # this process's Prometheus endpoint, set by the server
        self._pins: dict[str, Pin] = {}
        # Transfers released before their prefill ended (the decode side gave up first): transfer
        # id -> (when to forget it, the nonce of the ticket it was released with). Their pins are
        # dropped the moment the prefill ends, if it ran under that same ticket.
        self._released_early: dict[str, tuple[float, bytes]] = {}
        self._num_importing_blocks = 0  # pulled (or being pulled) here, not yet handed to their request
        self._background: set[asyncio.Task] = set()  # clean-ups that outlive a cancelled call
        self._cut_next_pull = False  # fault injection (AgentConfig.fault_injection)
        self._peer_stubs: dict[str, agent_pb2_grpc.AgentStub] = {}
        self._peer_channels: list[grpc.aio.Channel] = []
        self._janitor: asyncio.Task | None = None
        self.latency = OnlineStepModel(min_interval_s=LATENCY_REFIT_INTERVAL_S)
        self._profile_lock = asyncio.Lock()
        self._recording: list[StepSample] | None = None  # a profile's samples, while one runs

    @property
    def worker_id(self) -> str:
        return self._config.worker_id

    def start(self) -> None:
        self._janitor = asyncio.create_task(self._expire_pins(), name="pin-janitor")

    async def close(self) -> None:
        if self._janitor:
            self._janitor.cancel()
        if self._background:
            await asyncio.wait(set(self._background), timeout=5)
        for channel in self._peer_channels:
            await channel.close()
        for transfer_id in list(self._pins):
            self._release(transfer_id)

    # -- helpers ----------------------------------------------------------------------------

    async def _check_ticket(
        self, ticket: common_pb2.Ticket, context, operation: str, *, use: str | None = None, check_expiry: bool = True, **binding
    ) -> None:
        """Aborts with PERMISSION_DENIED unless `ticket` is genuine, for `operation`, bound to this
        call (`binding`: see tickets.check_request) and, with `use`, not used for that before."""
        try:
            self._verifier().verify(ticket, operation, check_expiry=check_expiry, now=self._clock())
            tickets.check_request(ticket, worker_id=self.worker_id, **binding)
            if use is not None:
                self._replays.use(ticket, use, now=self._clock())
        except tickets.VerifierNotReady as e:
            # Not yet registered (starting, or its control plane replica just died): a worker that
            # cannot serve for now, so the control plane tries another (core/failover.py).
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except tickets.TicketError as e:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))

    async def _check_peer(self, ticket: common_pb2.Ticket, context) -> None:
        """With mTLS: the caller must be a worker, the decode worker the ticket names. (A plaintext
        agent has no caller identity and relies on the ticket alone.)"""
        identity = caller()
        if identity is not None and (identity.role is not Role.WORKER or identity.name != ticket.decode_worker_id):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{identity} is not the worker this transfer's ticket was issued to")

    async def _check_accepting(self, context) -> None:
        if self.state == common_pb2.WORKER_STATE_DRAINING:
            # UNAVAILABLE, not FAILED_PRECONDITION: the control plane retries elsewhere.
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"worker {self.worker_id} is draining and takes no new requests")

    def _peer(self, source: agent_pb2.PrefillSource) -> agent_pb2_grpc.AgentStub:
        """A stub for the prefill peer: with mTLS its channel accepts only a certificate that names
        source.worker_id, a worker (the ticket names it; Generate checked the source against it)."""
        key = f"{source.worker_id}@{source.endpoint}"
        stub = self._peer_stubs.get(key)
        if stub is None:
            channel = aio_channel(source.endpoint, self._credentials.for_peer(Identity(Role.WORKER, source.worker_id)))
            self._peer_channels.append(channel)
            stub = self._peer_stubs[key] = agent_pb2_grpc.AgentStub(channel)
        return stub

    async def _check_healthy(self, context) -> None:
        reason = self._engine.health()
        if reason is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"worker {self.worker_id}'s engine is not serving: {reason}")

    async def _require_kv(self, context, what: str) -> KVImportExport:
        if self._kv is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"worker {self.worker_id} runs the {self._config.engine_name} engine, which does not move KV through "
                f"kvplane transports, so it cannot {what}; send it requests without disaggregation",
            )
        return self._kv

    def _unpin(self, block_ids: list[int]) -> None:
        if block_ids:  # only ever non-empty with the KV capability
            self._kv.unpin(block_ids)

    def _spawn(self, coro, name: str) -> None:
        """Runs a clean-up that must finish even when the call that needs it is cancelled."""
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def cut_next_pull(self) -> None:
        """Fault injection: the next PullKV stream served breaks after its first chunk."""
        self._cut_next_pull = True

    @property
    def num_pinned_blocks(self) -> int:
        """Blocks held for KV transfers: pinned for peers, or pulled here and not yet handed over."""
        return sum(len(p.block_ids) for p in self._pins.values()) + self._num_importing_blocks

    def _register_pin(self, transfer_id: str, block_ids: list[int], ticket: common_pb2.Ticket) -> float | None:
        """Pins a transfer's blocks until pulled, released or expired, for the puller its ticket
        names; returns the expiry, or None (and unpins at once) when that puller released it
        already, or the id is taken."""
        early = self._released_early.pop(transfer_id, None)
        if (early is not None and early[1] == ticket.nonce) or transfer_id in self._pins:
            self._unpin(block_ids)
            return None
        expires_at = self._clock() + self._config.pin_timeout_s
        self._pins[transfer_id] = Pin(block_ids, expires_at, ticket.nonce, ticket.decode_worker_id)
        return expires_at

    def _release(self, transfer_id: str, early_nonce: bytes | None = None) -> bool:
        """Unpins a transfer. `early_nonce`: the puller gave up, so a transfer not pinned yet (its
        prefill still running under the ticket with that nonce) is remembered and unpinned when it ends."""
        pin = self._pins.pop(transfer_id, None)
        if pin is None:
            if early_nonce is not None and transfer_id:
                self._released_early[transfer_id] = (self._clock() + self._config.pin_timeout_s, early_nonce)
            return False
        self._unpin(pin.block_ids)
        return True

    def expire_pins(self) -> list[str]:
        """Releases every pin past its expiry; returns their transfer ids."""
        now = self._clock()
        for transfer_id in [t for t, (until, _) in self._released_early.items() if until < now]:
            del self._released_early[transfer_id]
        expired = [t for t, p in self._pins.items() if p.expires_at < now]
        for transfer_id in expired:
            log.warning("transfer %s was not pulled in time; unpinning its blocks", transfer_id)
            self._release(transfer_id)
        return expired

    async def _expire_pins(self) -> None:
        while True:
            await asyncio.sleep(self._config.pin_check_interval_s)
            self.expire_pins()

    # -- Generate (decode side, or both) ------------------------------------------------------

    async def Generate(self, request: agent_pb2.AgentGenerateRequest, context):
        arrived = time.monotonic()  # its place in the engine's queue, kept while a remote prefill runs
        prompt = list(request.prompt_token_ids)
        identity = caller()
        if identity is not None and identity.role is not Role.CONTROLPLANE and identity.cache_tenant != request.ticket.tenant:
            # Lookaside mode: a client runs its own placement, never another tenant's (checked
            # before the ticket is used, so a stolen placement cannot be burnt by someone else).
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{identity} may not run a request placed for another tenant")
        await self._check_ticket(
            request.ticket, context, tickets.GENERATE, use="generate",
            request_id=request.request_id, prompt_token_ids=prompt, cache_salt=request.cache_salt, generate=request,
        )  # fmt: skip
        await self._check_accepting(context)
        await self._check_healthy(context)
        if request.num_resumed_tokens >= len(prompt):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "num_resumed_tokens must be smaller than the prompt")
        metrics = common_pb2.RequestMetrics(decode_worker=self.worker_id, prefill_worker=self.worker_id, prompt_tokens=len(prompt))
        held: list[int] = []
        handoff = b""
        remote = request.HasField("prefill_from") and request.prefill_from.endpoint
        if remote and self._native is not None:
            if request.prefill_from.cached_only:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"worker {self.worker_id}'s engine moves KV only by its own connector ({self._native.transport}), "
                    "which cannot fetch cached blocks from a peer; prefill locally instead",
                )
            try:
                with tracing.span(tracing.SPAN_REMOTE_PREFILL, {"kvplane.prefill_worker": request.prefill_from.worker_id}):
                    handoff = await self._native_remote_prefill(request, metrics, context.time_remaining())
            except RemotePrefillRefused as e:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            except Exception as e:  # the peer died or timed out: prefill here
                log.warning("remote prefill on %s failed (%s); prefilling locally", request.prefill_from.worker_id, e)
                metrics.prefill_worker = self.worker_id
                metrics.disaggregated = False
        elif remote:
            await self._require_kv(context, "import KV from a peer")
            prefilled = asyncio.Event()
            pulling = asyncio.ensure_future(self._traced_remote_prefill(request, metrics, context.time_remaining(), prefilled.set))
            try:
                if request.report_prefill_done and not request.prefill_from.cached_only:
                    # Told before the pull (which may wait for free blocks): the caller's count of
                    # the prefill worker's queue drops when the prefill ends, not at the first token.
                    waiting = asyncio.ensure_future(prefilled.wait())
                    try:
                        await asyncio.wait((pulling, waiting), return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        waiting.cancel()  # also when the caller goes away meanwhile: no task left waiting
                    if prefilled.is_set():
                        yield agent_pb2.AgentGenerateResponse(remote_prefill_done=True)
                held = await pulling
                record_transfer(metrics)
            except RemotePrefillRefused as e:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            except Exception as e:  # the peer died, timed out or ran out of room: prefill here
                log.warning("remote prefill on %s failed (%s); prefilling locally", request.prefill_from.worker_id, e)
                metrics.prefill_worker = self.worker_id
                metrics.disaggregated = False
                metrics.kv_fetched_from = ""
                metrics.kv_fetched_tokens = 0
            finally:
                if not pulling.done():
                    pulling.cancel()  # the caller went away while it was told: the pull's own cleanup runs
                elif not held and not pulling.cancelled() and pulling.exception() is None:
                    self._unpin(pulling.result())  # pulled, but the caller went away before taking it
                    self._num_importing_blocks -= len(pulling.result())
        engine_request = EngineRequest(
            request_id=request.request_id or uuid.uuid4().hex,
            prompt_token_ids=prompt,
            sampling=sampling_from_pb(request.sampling),
            cache_salt=request.cache_salt,
            held_block_ids=held,
            native_handoff=handoff,
            queued_since=arrived,
        )
        timer = EngineTimer(PHASE_GENERATE)
        try:
            stream = await self._engine.generate(engine_request)
        except EngineInputError as e:
            self._unpin(held)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except EngineCapacityError as e:
            self._unpin(held)
            # Permanent for this worker (it can never hold the request): not a retry-later.
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except BaseException:
            self._unpin(held)  # cancelled before the engine took the imported blocks
            raise
        finally:
            self._num_importing_blocks -= len(held)  # the engine (or the unpin) has them now
        started = time.monotonic()
        # A relaying control plane detokenizes itself (request.tokens_only); a lookaside caller
        # gets the text from here.
        text = None if request.tokens_only else TextStream(self._engine.detokenize)
        if text is not None:
            # After the prompt, and after the resumed tokens, whose text the caller has already.
            resumed_at = len(prompt) - request.num_resumed_tokens
            await text.start_after(prompt[:resumed_at], prompt[resumed_at:])
        finished = False
        # Tokens per message after the first (the caller's stream_interval): held ones go out with
        # the N-th, or the last.
        interval, sent_first = max(request.stream_interval, 1), False
        held_tokens: list[int] = []
        held_text: list[str] = []
        try:
            async for out in stream:
                finished = out.finished
                timer.on_output(out)
                if out.error:
                    await context.abort(grpc.StatusCode.INTERNAL, f"engine failed on this request: {out.error}")
                held_tokens += out.new_token_ids
                if text is not None:
                    held_text.append(await text.push(out.new_token_ids, final=finished))
                if not finished and (len(held_tokens) < interval if sent_first else not held_tokens):
                    continue
                sent_first = sent_first or bool(held_tokens)
                reply = agent_pb2.AgentGenerateResponse(
                    token_ids=held_tokens, text="".join(held_text), finished=finished, finish_reason=out.finish_reason or ""
                )
                held_tokens, held_text = [], []
                if reply.token_ids and not metrics.ttft_ms:
                    metrics.ttft_ms = (time.monotonic() - started) * 1000
                    if handoff:  # the decode engine pulled the KV before its first token
                        metrics.kv_transfer_ms = metrics.ttft_ms
                        record_transfer(metrics)
                if finished:
                    if not metrics.disaggregated:
                        metrics.cached_tokens = out.num_cached_tokens
                        metrics.prefill_computed_tokens = out.num_prompt_tokens - out.num_cached_tokens
                    reply.metrics.CopyFrom(metrics)
                    if log.isEnabledFor(logging.DEBUG):
                        log.debug("generate finished", extra={
                            "request_id": request.request_id, "prompt_tokens": metrics.prompt_tokens,
                            "cached_tokens": metrics.cached_tokens, "output_tokens": timer.num_output_tokens,
                            "disaggregated": metrics.disaggregated, "finish_reason": out.finish_reason or "",
                        })  # fmt: skip
                yield reply
        finally:
            if not finished:
                # The caller went away: stop spending compute on it.
                self._engine.abort(engine_request.request_id)

    async def _native_remote_prefill(
        self, request: agent_pb2.AgentGenerateRequest, metrics: common_pb2.RequestMetrics, time_left_s: float | None
    ) -> bytes:
        """Has the peer's engine prefill for this one; returns its handoff for this engine. Bounded
        by the request's own deadline (`time_left_s`) as well as prefill_timeout_s."""
        deadline = None if time_left_s is None else time.monotonic() + time_left_s
        source = request.prefill_from
        native = self._native
        layout = self._engine.info.layout
        try:
            reply = await self._peer(source).Prefill(
                agent_pb2.PrefillRequest(
                    ticket=request.ticket,
                    request_id=request.request_id,
                    prompt_token_ids=request.prompt_token_ids,
                    cache_salt=request.cache_salt,
                    layout=layout_to_pb(layout),
                    transports=[native.transport],
                ),
                timeout=_bounded(self._config.prefill_timeout_s, deadline),
            )
        except grpc.aio.AioRpcError as e:
            if e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                raise RemotePrefillRefused(f"prefill worker {source.worker_id} refused: {e.details()}") from None
            raise
        if reply.transport != native.transport or not reply.transport_descriptor:
            raise RemotePrefillRefused(
                f"prefill worker {source.worker_id} answered with transport {reply.transport!r}, not {native.transport!r}"
            )
        num_prompt_tokens = len(request.prompt_token_ids)
        metrics.transport = reply.transport
        metrics.prefill_worker = source.worker_id
        metrics.disaggregated = True
        metrics.cached_tokens = reply.cached_tokens
        metrics.prefill_computed_tokens = reply.prefill_computed_tokens
        # The engines move the whole prompt's KV; kvplane does not see the bytes, so it counts them.
        metrics.kv_transfer_blocks = -(-num_prompt_tokens // layout.block_size)
        metrics.kv_transfer_bytes = num_prompt_tokens * layout.bytes_per_token
        return reply.transport_descriptor

    async def _traced_remote_prefill(
        self, request: agent_pb2.AgentGenerateRequest, metrics: common_pb2.RequestMetrics, time_left_s: float | None,
        on_prefilled: Callable[[], None],
    ) -> list[int]:  # fmt: skip
        with tracing.span(tracing.SPAN_REMOTE_PREFILL, {"kvplane.prefill_worker": request.prefill_from.worker_id}):
            return await self._remote_prefill(request, metrics, time_left_s, on_prefilled)

    async def _remote_prefill(
        self, request: agent_pb2.AgentGenerateRequest, metrics: common_pb2.RequestMetrics, time_left_s: float | None,
        on_prefilled: Callable[[], None],
    ) -> list[int]:  # fmt: skip
        """Has the peer prefill, pulls the missing blocks into this pool; returns the refs taken on
        them (counted in num_pinned_blocks until the caller hands them to the engine).

        Bounded by the request's own deadline (`time_left_s`, None = none) as well as
        prefill_timeout_s. This side names the transfer, so it can release the peer's pins in the
        background whatever happens, even before the peer's answer arrives: a cancelled request
        leaves nothing pinned there."""
        deadline = None if time_left_s is None else time.monotonic() + time_left_s
        source = request.prefill_from
        kv = self._kv
        layout = self._engine.info.layout
        peer = self._peer(source)
        offered = [source.transport] if source.transport else list(self._transports)
        transfer_id = uuid.uuid4().hex  # ours, so that we can release it even without an answer
        try:
            reply = await peer.Prefill(
                agent_pb2.PrefillRequest(
                    ticket=request.ticket,
                    request_id=request.request_id,
                    prompt_token_ids=request.prompt_token_ids,
                    cache_salt=request.cache_salt,
                    layout=layout_to_pb(layout),
                    transports=offered,
                    cached_only=source.cached_only,
                    transfer_id=transfer_id,
                ),
                timeout=_bounded(self._config.prefill_timeout_s, deadline),
            )
        except grpc.aio.AioRpcError as e:
            self._spawn(self._release_peer(peer, transfer_id, request.ticket), f"release-{transfer_id}")
            if e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                raise RemotePrefillRefused(f"prefill worker {source.worker_id} refused: {e.details()}") from None
            raise
        except BaseException:
            # Cancelled (the request's caller went away) while the peer prefills: the answer, and
            # its pins, may be on their way; release them by the id we chose.
            self._spawn(self._release_peer(peer, transfer_id, request.ticket), f"release-{transfer_id}")
            raise
        metrics.transport = reply.transport
        on_prefilled()
        if source.cached_only:
            # Fetch instead of recompute: the prefill itself runs here, after the pulled prefix.
            metrics.kv_fetched_from = source.worker_id
        else:
            metrics.prefill_worker = source.worker_id
            metrics.disaggregated = True
            metrics.cached_tokens = reply.cached_tokens
            metrics.prefill_computed_tokens = reply.prefill_computed_tokens
        transport = self._transports[reply.transport]
        released = False
        held: list[int] = []
        started = time.monotonic()
        try:
            hashes = _own_block_hashes(kv, request, reply, source.worker_id)
            missing = kv.missing_blocks(hashes)
            if source.cached_only:
                metrics.kv_fetched_tokens = len(missing) * layout.block_size
            if missing:
                dst = await self._allocate_for_import(kv, len(missing), deadline)
                # The pull from here: a wait for free blocks is not the link's time (the control
                # plane learns the link's rate from kv_transfer_ms).
                started = time.monotonic()
                self._num_importing_blocks += len(dst)
                try:
                    source_desc = PullSource(
                        endpoint=source.endpoint,
                        transfer_id=reply.transfer_id,
                        descriptor=reply.transport_descriptor,
                        layout=layout_from_pb(reply.layout),
                        ticket=request.ticket,
                        worker_id=source.worker_id,
                    )
                    with tracing.span(tracing.SPAN_KV_TRANSFER, {"kvplane.kv_transfer.transport": reply.transport}) as span:
                        pull = transport.pull(source_desc, missing, dst)
                        nbytes = await asyncio.wait_for(pull, _bounded(self._config.transfer_timeout_s, deadline))
                        span.set_attributes({"kvplane.kv_transfer.bytes": nbytes, "kvplane.kv_transfer.blocks": len(missing)})
                    released = reply.transport == "grpc"  # the gRPC pull asked the peer to unpin when done
                    # Before anything is cached: the bytes are the ones the producer vouched for.
                    await asyncio.to_thread(check_imported, kv.pool, dst, [reply.block_digests[i] for i in missing])
                    held = kv.commit_import([hashes[i] for i in missing], dst)
                except BaseException:
                    kv.abort_import(dst)
                    self._num_importing_blocks -= len(dst)
                    raise
                metrics.kv_transfer_bytes = nbytes
                metrics.kv_transfer_blocks = len(missing)
        except LayoutMismatchError as e:
            raise RemotePrefillRefused(str(e)) from None
        except KVIntegrityError as e:
            log.error("KV from prefill worker %s failed its check and was not imported: %s", source.worker_id, e)
            raise
        except TimeoutError:
            raise TransferError(f"pulling KV from {source.worker_id} made no progress in time") from None
        finally:
            metrics.kv_transfer_ms = (time.monotonic() - started) * 1000
            if not released:
                # In the background: this call may be being cancelled, and the peer must unpin anyway.
                self._spawn(self._release_peer(peer, reply.transfer_id, request.ticket), f"release-{reply.transfer_id}")
        return held

    async def _allocate_for_import(self, kv: KVImportExport, num_blocks: int, deadline: float | None) -> list[int]:
        """Blocks to pull `num_blocks` into. A full pool is waited on while its steps free blocks,
        as vLLM's and SGLang's decode workers queue for memory: the prompt is computed already,
        and prefilling it again here would need the same blocks. Gives up (RuntimeError: the
        caller prefills locally) after import_wait_s or at the request's deadline."""
        wait_s = _bounded(self._config.import_wait_s, deadline)
        give_up_at = time.monotonic() + wait_s
        while (dst := kv.allocate_for_import(num_blocks)) is None:
            if time.monotonic() >= give_up_at:
                raise RuntimeError(f"no free KV blocks for {num_blocks} imported blocks after waiting {wait_s:g} s")
            await asyncio.sleep(IMPORT_POLL_S)
        return dst

    async def _release_peer(self, peer: agent_pb2_grpc.AgentStub, transfer_id: str, ticket: common_pb2.Ticket) -> None:
        try:
            await peer.ReleaseKV(agent_pb2.ReleaseKVRequest(transfer_id=transfer_id, ticket=ticket), timeout=5)
        except grpc.aio.AioRpcError as e:
            log.warning("releasing transfer %s failed (%s); the peer unpins it on timeout", transfer_id, e.details())

    # -- Prefill and KV serving (prefill side) --------------------------------------------------

    async def Prefill(self, request: agent_pb2.PrefillRequest, context):
        # The caller first, so that another worker holding a copy of the ticket cannot burn its use.
        await self._check_peer(request.ticket, context)
        await self._check_ticket(
            request.ticket, context, tickets.GENERATE, use="prefill", as_source=True,
            request_id=request.request_id, prompt_token_ids=request.prompt_token_ids, cache_salt=request.cache_salt,
            cached_only=request.cached_only,
        )  # fmt: skip
        if len(request.transfer_id) > MAX_ID_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"transfer_id is longer than {MAX_ID_CHARS} characters")
        await self._check_accepting(context)
        await self._check_healthy(context)
        if not self._config.role.can_prefill and not request.cached_only:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"worker {self.worker_id} has role {self._config.role.value} and does not prefill for peers",
            )
        layout = self._engine.info.layout
        mismatch = layout.mismatch(layout_from_pb(request.layout))
        if mismatch:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot transfer KV from {self.worker_id}: {mismatch}")
        if self._native is not None:
            return await self._native_prefill(request, context)
        kv = await self._require_kv(context, "export KV to a peer")
        transport_name = next((t for t in request.transports if t in self._transports), None)
        if transport_name is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no common KV transport: the decode side offers {list(request.transports)}, this agent serves {list(self._transports)}",
            )
        if request.cached_only:
            try:
                response, block_ids = self._pin_cached(kv, request, transport_name)
            except TransferReleased as e:
                await context.abort(grpc.StatusCode.CANCELLED, f"transfer {e} was released by its puller already")
            response.block_digests.extend(await asyncio.to_thread(block_digests, kv.pool, block_ids))
            return response
        engine_request = EngineRequest(
            request_id=f"{request.request_id or uuid.uuid4().hex}:prefill",
            prompt_token_ids=list(request.prompt_token_ids),
            sampling=SamplingParams(max_tokens=1),
            cache_salt=request.cache_salt,
            prefill_only=True,
        )
        timer = EngineTimer(PHASE_PREFILL)
        try:
            stream = await self._engine.generate(engine_request)
        except EngineInputError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except EngineCapacityError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        # The stream is drained by its own task: if this call is cancelled (the decode side's
        # deadline, its death), the task still sees the final output and unpins what the engine
        # pinned for a pull that will never come.
        drained = asyncio.ensure_future(_final_output(stream, timer))
        try:
            out = await asyncio.shield(drained)
        except asyncio.CancelledError:
            self._engine.abort(engine_request.request_id)
            drained.add_done_callback(self._unpin_abandoned)
            self._background.add(drained)
            drained.add_done_callback(self._background.discard)
            raise
        if out.error or out.finish_reason == "abort":
            self._unpin(out.pinned_block_ids)
            await context.abort(grpc.StatusCode.INTERNAL, f"prefill failed: {out.error or 'aborted'}")
        transfer_id = request.transfer_id or uuid.uuid4().hex
        expires_at = self._register_pin(transfer_id, list(out.pinned_block_ids), request.ticket)
        if expires_at is None:
            await context.abort(
                grpc.StatusCode.CANCELLED, f"transfer {clip(transfer_id)} was released by its puller before its prefill ended"
            )
        # After the pin is registered: if this call is cancelled now, the pin still expires.
        digests = await asyncio.to_thread(block_digests, kv.pool, out.pinned_block_ids)
        return agent_pb2.PrefillResponse(
            transfer_id=transfer_id,
            block_hashes=list(out.block_hashes),
            prefill_computed_tokens=out.num_prompt_tokens - out.num_cached_tokens,
            cached_tokens=out.num_cached_tokens,
            transport=transport_name,
            transport_descriptor=self._transports[transport_name].describe(out.pinned_block_ids),
            expires_at=expires_at,
            layout=layout_to_pb(layout),
            block_digests=digests,
        )

    def _unpin_abandoned(self, drained: asyncio.Future) -> None:
        """An abandoned prefill ended: unpin its blocks, if it finished before the abort reached it."""
        if not drained.cancelled() and drained.exception() is None:
            self._unpin(drained.result().pinned_block_ids)

    async def _native_prefill(self, request: agent_pb2.PrefillRequest, context) -> agent_pb2.PrefillResponse:
        """Prefill side of engine-native disaggregation: the engine prefills and hands off."""
        native = self._native
        if request.cached_only:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"worker {self.worker_id}'s engine moves KV only by its own connector ({native.transport}), which cannot serve a fetch",
            )
        if native.transport not in request.transports:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no common KV transport: the decode side offers {list(request.transports)}, this agent's engine hands off by {native.transport}",
            )
        engine_request = EngineRequest(
            request_id=f"{request.request_id or uuid.uuid4().hex}:prefill",
            prompt_token_ids=list(request.prompt_token_ids),
            sampling=SamplingParams(max_tokens=1),
            cache_salt=request.cache_salt,
            prefill_only=True,
        )
        try:
            handoff = await native.prefill(engine_request)
        except EngineInputError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except EngineCapacityError as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except RuntimeError as e:
            await context.abort(grpc.StatusCode.INTERNAL, f"prefill failed: {e}")
        return agent_pb2.PrefillResponse(
            transfer_id=uuid.uuid4().hex,
            prefill_computed_tokens=handoff.num_prompt_tokens - handoff.num_cached_tokens,
            cached_tokens=handoff.num_cached_tokens,
            transport=handoff.transport,
            transport_descriptor=handoff.params,
            layout=layout_to_pb(self._engine.info.layout),
        )

    def _pin_cached(
        self, kv: KVImportExport, request: agent_pb2.PrefillRequest, transport_name: str
    ) -> tuple[agent_pb2.PrefillResponse, list[int]]:
        """Fetch instead of recompute, source side: pin what is cached, compute nothing; returns
        the answer (without digests) and the pinned block ids."""
        hashes, block_ids = kv.pin_cached_prefix(list(request.prompt_token_ids), request.cache_salt)
        layout = self._engine.info.layout
        transfer_id = request.transfer_id or uuid.uuid4().hex
        expires_at = self._register_pin(transfer_id, block_ids, request.ticket)
        if expires_at is None:
            raise TransferReleased(transfer_id)
        response = agent_pb2.PrefillResponse(
            transfer_id=transfer_id,
            block_hashes=list(hashes),
            cached_tokens=len(hashes) * layout.block_size,
            transport=transport_name,
            transport_descriptor=self._transports[transport_name].describe(block_ids),
            expires_at=expires_at,
            layout=layout_to_pb(layout),
        )
        return response, block_ids

    async def _pin_for(self, transfer_id: str, ticket: common_pb2.Ticket, context) -> Pin:
        """The transfer's pin, when `ticket` is the one it was prefilled under (its expiry is the
        pin's own, so a long prefill does not strand its pull) and the caller is its puller."""
        await self._check_ticket(ticket, context, tickets.GENERATE, check_expiry=False, as_source=True)
        await self._check_peer(ticket, context)
        pin = self._pins.get(transfer_id)
        if pin is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown or expired transfer {clip(transfer_id)}: prefill again")
        if pin.nonce != ticket.nonce:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "the ticket is not the one this transfer was prefilled under")
        return pin

    async def PullKV(self, request: agent_pb2.PullKVRequest, context):
        pin = await self._pin_for(request.transfer_id, request.ticket, context)
        mismatch = self._engine.info.layout.mismatch(layout_from_pb(request.layout))
        if mismatch:
            self._release(request.transfer_id)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot transfer KV from {self.worker_id}: {mismatch}")
        bad = [i for i in request.block_indices if i >= len(pin.block_ids)]
        if bad:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"block indices {bad[:5]} are outside the transfer's {len(pin.block_ids)} blocks"
            )
        try:
            # A pin exists, so the engine has the KV capability.
            for chunk in iter_chunks(self._kv.pool, pin.block_ids, list(request.block_indices), request.chunk_bytes or 1 << 20):
                yield chunk
                if self._cut_next_pull:
                    self._cut_next_pull = False
                    log.warning("fault injection: cutting the pull of transfer %s after its first chunk", request.transfer_id)
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "fault injection: the transfer was cut mid-way")
        finally:
            if request.release_after:
                self._release(request.transfer_id)

    async def ReleaseKV(self, request: agent_pb2.ReleaseKVRequest, context):
        # Bounded before anything is kept: 150 calls with 4 MiB ids once grew an agent by 640 MB.
        if len(request.transfer_id) > MAX_ID_CHARS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"transfer_id is longer than {MAX_ID_CHARS} characters")
        if request.transfer_id not in self._pins:
            # Not pinned (yet): its prefill may still run, so the release is remembered for the
            # ticket it was prefilled under. That takes a genuine ticket naming this worker as
            # source and still valid: an expired one cannot belong to a prefill about to pin.
            await self._check_ticket(request.ticket, context, tickets.GENERATE, as_source=True)
            await self._check_peer(request.ticket, context)
            while len(self._released_early) >= MAX_EARLY_RELEASES:  # oldest first: its pin, if any, still expires
                del self._released_early[next(iter(self._released_early))]
            return agent_pb2.ReleaseKVResponse(released=self._release(request.transfer_id, early_nonce=request.ticket.nonce))
        # Pinned: the ticket must be the pin's own, and the pin's expiry (not the ticket's) bounds it.
        await self._pin_for(request.transfer_id, request.ticket, context)
        return agent_pb2.ReleaseKVResponse(released=self._release(request.transfer_id))

    # -- operations -------------------------------------------------------------------------------

    async def Drain(self, request, context):
        await self._check_ticket(request.ticket, context, tickets.DRAIN, use="drain")
        self.state = common_pb2.WORKER_STATE_DRAINING
        load = self._engine.load()
        log.info("draining: %d running, %d waiting requests will finish", load.num_running, load.num_waiting)
        return agent_pb2.DrainResponse(state=self.state, num_running=load.num_running + load.num_waiting)

    async def Undrain(self, request, context):
        await self._check_ticket(request.ticket, context, tickets.UNDRAIN, use="undrain")
        self.state = common_pb2.WORKER_STATE_ACTIVE
        load = self._engine.load()
        log.info("undrained: taking new requests again")
        return agent_pb2.DrainResponse(state=self.state, num_running=load.num_running + load.num_waiting)

    async def Profile(self, request: agent_pb2.ProfileRequest, context):
        await self._check_ticket(request.ticket, context, tickets.PROFILE, use="profile")
        if self.state == common_pb2.WORKER_STATE_DRAINING:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"worker {self.worker_id} is draining; profile it before draining")
        profiling = self._engine.profiling
        if profiling is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"worker {self.worker_id} runs the {self._config.engine_name} engine, which does not measure its steps; nothing to profile",
            )
        async with self._profile_lock:  # one profile at a time; other traffic keeps running
            plan = profile.plan(self._engine, request.max_prompt_tokens, request.max_batch)
            try:
                self.collect_step_timings()
                await profile.warm_up(self._engine, plan)
                profiling.take_step_timings()  # warm-up steps pay one-off costs: learn nothing from them
                self._recording = samples = []
                await profile.run(self._engine, plan)
                self.collect_step_timings()
            except profile.ProfileError as e:
                await context.abort(grpc.StatusCode.INTERNAL, str(e))
            finally:
                self._recording = None
        model = fit(samples, seeded_from_profile=True)
        if model is None:
            await context.abort(grpc.StatusCode.INTERNAL, f"the profile measured only {len(samples)} steps, too few to fit")
        self.latency.seed(samples)
        log.info(
            "profiled %d steps; step-time model %s (mean abs error %.1f%%)",
            len(samples),
            model.coefficients,
            100 * model.mean_abs_pct_error,
        )
        return agent_pb2.ProfileResponse(profile=samples_to_pb(samples, time.time()), model=model.to_pb())

    async def GetStatus(self, request, context):
        return agent_pb2.GetStatusResponse(info=self.worker_info(), load=self.worker_load())

    # -- what the link reports ---------------------------------------------------------------------

    def worker_info(self) -> common_pb2.WorkerInfo:
        info = self._engine.info
        return common_pb2.WorkerInfo(
            worker_id=self.worker_id,
            role=role_to_pb(self._config.role),
            endpoint=self.endpoint,
            model=info.model,
            layout=layout_to_pb(info.layout),
            state=self.state,
            max_context=info.max_context,
            vocab_size=info.vocab_size,
            transports=list(self._transports) or ([self._native.transport] if self._native is not None else []),
            max_tokens_limit=info.max_tokens_limit,
            max_num_batched_tokens=info.max_num_batched_tokens,
            max_num_seqs=info.max_num_seqs,
            metrics_url=self.metrics_url,
            tokenizer=info.tokenizer,
            hardware=self._config.hardware or info.hardware,
            link_gb_per_s=self._config.link_gb_per_s or info.link_gb_per_s,
        )

    def collect_step_timings(self) -> list[StepSample]:
        """Moves the engine's new step timings into the online model (or the running profile)."""
        profiling = self._engine.profiling
        samples = profiling.take_step_timings() if profiling is not None else []
        if samples:
            if self._recording is not None:
                self._recording.extend(samples)  # they become the seed; not counted twice
            else:
                self.latency.add(samples)
        return samples

    def latency_model(self) -> StepTimeModel | None:
        self.collect_step_timings()
        return self.latency.model()

    def latency_model_pb(self) -> common_pb2.LatencyModel | None:
        model = self.latency_model()
        return model.to_pb() if model is not None else None

    def seed_latency(self, stored: common_pb2.LatencyProfile) -> None:
        """Seeds the online model from the profile the control plane stored for this worker."""
        samples = samples_from_pb(stored)
        if samples:
            self.latency.seed(samples)
            log.info("seeded the step-time model from a stored profile of %d steps", len(samples))

    def worker_load(self) -> common_pb2.WorkerLoad:
        load = self._engine.load()
        return common_pb2.WorkerLoad(
            num_running=load.num_running,
            num_waiting=load.num_waiting,
            num_queued_prefill_tokens=load.num_queued_prefill_tokens,
            num_free_blocks=load.num_free_blocks,
            num_used_blocks=load.num_used_blocks,
            num_total_blocks=load.num_total_blocks,
            num_cached_blocks=load.num_cached_blocks,
            running_remaining_tokens=list(load.running_remaining_tokens),
            running_context_tokens=load.running_context_tokens,
            num_pinned_blocks=self.num_pinned_blocks,
        )


async def _final_output(stream, timer: EngineTimer):
    """Drains an engine stream, timing it; returns its final output."""
    async for out in stream:
        timer.on_output(out)
    return out


def _bounded(limit_s: float, deadline: float | None) -> float:
    """`limit_s`, or less when the request's deadline (time.monotonic()) comes first (never below 0)."""
    return limit_s if deadline is None else max(0.0, min(limit_s, deadline - time.monotonic()))


def _own_block_hashes(
    kv: KVImportExport, request: agent_pb2.AgentGenerateRequest, reply: agent_pb2.PrefillResponse, peer: str
) -> list[BlockHash]:
    """The hashes to commit the peer's blocks under: this engine's own for the request's prompt and
    cache salt (which the ticket binds), as many as the peer pinned. The peer's hashes must be a
    prefix of them and come with one digest each, or nothing is imported: a peer that names other
    hashes answered for another prompt (or plants KV under another tenant's prefix, issue 28)."""
    own = kv.prompt_block_hashes(list(request.prompt_token_ids), request.cache_salt)
    theirs = list(reply.block_hashes)
    if len(theirs) > len(own):
        raise KVIntegrityError(f"prefill worker {peer} answered with {len(theirs)} blocks; the prompt has {len(own)} full blocks")
    first_wrong = next((i for i, (h, mine) in enumerate(zip(theirs, own)) if h != mine), None)
    if first_wrong is not None:
        raise KVIntegrityError(f"prefill worker {peer} answered with block hashes that are not this prompt's (from block {first_wrong} on)")
    if len(reply.block_digests) != len(theirs):
        raise KVIntegrityError(f"prefill worker {peer} sent {len(reply.block_digests)} block digests for {len(theirs)} blocks")
    return own[: len(theirs)]
