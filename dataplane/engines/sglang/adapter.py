"""SglangAdapter: an SGLang server behind the engine interface, through its gRPC scheduler API
(see api.py for the messages, dataplane/engines/external/engine.py for what all external engines
share). Detokenize uses the model's tokenizer.json (the `tokenizers` package, no
torch): the scheduler API takes and returns token ids only.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import msgpack  # noqa: F401 (the [engines] extra: checked when the adapter is built)
import zmq  # noqa: F401
from smg_grpc_proto import sglang_scheduler_pb2 as pb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc
from smg_grpc_proto.generated import common_pb2 as smg_common
from tokenizers import Tokenizer

from kvplane.dataplane.engines.base import NativeHandoff, NativeKVTransfer
from kvplane.dataplane.engines.external.engine import EngineUnreachable, ExternalEngine, LoadSample, ServerDescription
from kvplane.dataplane.engines.request import EngineInputError, EngineOutput, EngineRequest
from kvplane.dataplane.engines.sglang import api, bootstrap
from kvplane.dataplane.engines.sglang.config import SglangConfig

log = logging.getLogger(__name__)


class SglangAdapter(ExternalEngine):
    NAME = "sglang"

    def __init__(self, config: SglangConfig) -> None:
        super().__init__(config.validate(), config.target)
        self._channel: grpc.aio.Channel | None = None  # opened in start(), on the agent's event loop
        self._stub: pb_grpc.SglangSchedulerStub | None = None
        self._calls: dict[str, grpc.aio.UnaryStreamCall] = {}
        self._aborted: set[str] = set()
        self._background: set[asyncio.Task] = set()
        self._tokenizer: Tokenizer | None = None
        self._eos_token_ids: tuple[int, ...] = ()
        self.server: api.ServerArgs | None = None
        self._native: SglangBootstrap | None = None

    # -- ExternalEngine ---------------------------------------------------------------------------

    async def start(self) -> None:
        # The engine is a local server outside kvplane's trust domain: a plain channel to it.
        self._channel = grpc.aio.insecure_channel(self.endpoint)
        self._stub = pb_grpc.SglangSchedulerStub(self._channel)
        await super().start()

    async def describe(self) -> ServerDescription:
        try:
            health = await self._stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)
            model = await self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
            info = await self._stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        except grpc.aio.AioRpcError as e:
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise EngineUnreachable(e.details() or e.code().name) from None
            raise RuntimeError(f"the SGLang server at {self.endpoint} answered {e.code().name}: {e.details()}") from None
        if not health.healthy:
            raise EngineUnreachable(f"not healthy yet: {health.message}")
        self.server = server = api.server_args(info)
        self._eos_token_ids = tuple(model.eos_token_ids)
        self._tokenizer = _load_tokenizer(model.tokenizer_path or model.model_path, self.config.model_config)
        if server.disaggregation_mode in ("prefill", "decode"):
            host = self.config.bootstrap_host or self.endpoint.rpartition(":")[0]
            self._native = SglangBootstrap(self, bootstrap.transport(server.disaggregation_transfer_backend), host)
        return ServerDescription(
            served_model=model.served_model_name or model.model_path,
            model_path=model.model_path,
            block_size=server.page_size,
            kv_dtype=server.kv_cache_dtype,
            max_context=server.context_length or model.max_context_length,
            num_total_blocks=server.max_total_num_tokens // server.page_size,
            max_num_seqs=server.max_running_requests,
            max_num_batched_tokens=server.chunked_prefill_size,
            vocab_size=0,  # GetModelInfo's vocab_size is not the model's for every checkpoint: read config.json
        )

    async def read_load(self) -> LoadSample:
        loads = await self._stub.GetLoads(pb.GetLoadsRequest(), timeout=2)
        return LoadSample(*api.used_blocks(loads, self.server.page_size))

    async def flush_cache(self) -> bool:
        reply = await self._stub.FlushCache(smg_common.FlushCacheRequest(), timeout=10)
        return bool(reply.success)

    async def close(self) -> None:
        for request_id in list(self._calls):
            self.abort(request_id)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()

    # -- EngineAdapter ------------------------------------------------------------------------------

    @property
    def native_transfer(self) -> NativeKVTransfer | None:
        return self._native

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if request.held_block_ids:
            raise EngineInputError("the sglang engine does not import KV through kvplane's transports (held_block_ids)")
        if request.prefill_only:
            raise EngineInputError("the sglang engine prefills for a peer only through its bootstrap rooms (native_transfer.prefill)")
        mode = self.server.disaggregation_mode
        disaggregated = None
        if request.native_handoff:
            if mode != "decode":
                raise EngineInputError(f"this SGLang server runs in disaggregation mode {mode!r}: it cannot decode after a remote prefill")
            disaggregated = bootstrap.decode(request.native_handoff)
        elif mode != "null":
            raise EngineInputError(
                f"this SGLang server runs in disaggregation mode {mode!r}: it serves only disaggregated requests "
                "(run the control plane with --disagg-threshold 0 so every request is)"
            )
        return self._stream(request, disaggregated)

    async def _stream(self, request: EngineRequest, disaggregated: dict | None) -> AsyncIterator[EngineOutput]:
        request_id, num_prompt = request.request_id, len(request.prompt_token_ids)
        stop_ids = request.sampling.stop_token_ids
        call = self._stub.Generate(api.generate_request(pb, request, disaggregated))
        self._calls[request_id] = call
        self.inflight.started(request_id, num_prompt, request.sampling.max_tokens)
        reason: str | None = None
        error: str | None = None
        num_cached = 0
        ended = False  # the engine finished the request (no abort needed)
        try:
            try:
                async for response in call:
                    chunk = api.read_response(response, self._eos_token_ids, stop_ids)
                    num_prompt = chunk.num_prompt_tokens or num_prompt
                    num_cached = max(num_cached, chunk.num_cached_tokens)
                    if chunk.finish_reason is not None:
                        reason, ended = chunk.finish_reason, True
                        break
                    if chunk.token_ids:
                        self.inflight.progressed(request_id, len(chunk.token_ids))
                        yield EngineOutput(request_id, chunk.token_ids, False, None, num_prompt, num_cached)
            except grpc.aio.AioRpcError as e:
                if request_id in self._aborted or e.code() == grpc.StatusCode.CANCELLED:
                    reason = "abort"
                else:
                    reason, error = "error", f"the SGLang server ended the request with {e.code().name}: {e.details()}"
            if reason is None:
                reason = "abort" if request_id in self._aborted else "error"
                error = None if reason == "abort" else "the SGLang stream ended without a Complete"
            yield EngineOutput(request_id, [], True, reason, num_prompt, num_cached, error=error)
        finally:
            self._calls.pop(request_id, None)
            if not ended and request_id not in self._aborted:
                # Our reader went away (the caller cancelled): cancelling the call is not enough,
                # the scheduler keeps running a request until it is aborted.
                self._send_abort(request_id)
            self._aborted.discard(request_id)
            self.inflight.ended(request_id)
            call.cancel()

    def abort(self, request_id: str) -> None:
        call = self._calls.get(request_id)
        if call is None:
            return
        self._aborted.add(request_id)
        self._send_abort(request_id)  # abort in the scheduler (frees its KV at once), and stop reading the stream
        call.cancel()

    def _send_abort(self, request_id: str) -> None:
        self._spawn(self._stub.Abort(pb.AbortRequest(request_id=request_id, reason="cancelled by kvplane"), timeout=5))

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)
        return task

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        if self._tokenizer is None:
            return ""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)


class SglangBootstrap:
    """Prefill side of disaggregation through SGLang's bootstrap rooms (see bootstrap.py)."""

    def __init__(self, adapter: SglangAdapter, transport: str, host: str, rng: random.Random | None = None) -> None:
        self.transport = transport
        self._adapter = adapter
        self._host = host
        self._rng = rng or random.Random()

    async def prefill(self, request: EngineRequest) -> NativeHandoff:
        adapter = self._adapter
        server = adapter.server
        if server.disaggregation_mode != "prefill":
            raise EngineInputError(f"this SGLang server runs in disaggregation mode {server.disaggregation_mode!r}, not prefill")
        handoff = bootstrap.new_handoff(self._host, server.disaggregation_bootstrap_port, self._rng)
        engine_request = EngineRequest(request.request_id, request.prompt_token_ids, request.sampling, request.cache_salt)
        # The prefill waits in the engine until the decode side joins the room: run it apart.
        adapter._spawn(self._run(adapter._stream(engine_request, handoff), request.request_id))
        num_prompt = len(request.prompt_token_ids)
        return NativeHandoff(
            transport=self.transport,
            params=bootstrap.encode(handoff),
            num_prompt_tokens=num_prompt,
            num_cached_tokens=0,  # known only when the prefill ends, after this returns
            num_blocks=-(-num_prompt // server.page_size),
        )

    @staticmethod
    async def _run(stream: AsyncIterator[EngineOutput], request_id: str) -> None:
        async for out in stream:
            if out.finished and out.error:
                log.warning("SGLang prefill of %s failed: %s", request_id, out.error)


def _load_tokenizer(path: str, override: str) -> Tokenizer | None:
    for directory in (override, path):
        if directory and (Path(directory) / "tokenizer.json").is_file():
            return Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))
    log.warning("no tokenizer.json under %s: streamed text stays empty (token ids still stream)", path)
    return None


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("an SGLang background call failed: %s", task.exception())
