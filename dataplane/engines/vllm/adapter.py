"""VllmAdapter: a vLLM OpenAI-compatible server behind the engine interface (see api.py for the
messages, dataplane/engines/external/engine.py for what all external engines share).

Generate streams POST /v1/completions with token ids; the request id travels as X-Request-Id.
Abort closes the request's HTTP stream: vLLM aborts a request whose client went away. Detokenize is
the server's /detokenize (the control plane tokenizes). Describe reads /v1/models (served name,
model path, max_model_len) and /metrics (block size, KV blocks, KV dtype).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import httpx
import msgpack  # noqa: F401 (the [engines] extra: checked when the adapter is built)
import zmq  # noqa: F401

from kvplane.dataplane.engines.base import NativeHandoff, NativeKVTransfer
from kvplane.dataplane.engines.external.engine import EngineUnreachable, ExternalEngine, LoadSample, ServerDescription
from kvplane.dataplane.engines.request import EngineCapacityError, EngineInputError, EngineOutput, EngineRequest
from kvplane.dataplane.engines.vllm import api, nixl
from kvplane.dataplane.engines.vllm.config import VllmConfig

log = logging.getLogger(__name__)


class VllmAdapter(ExternalEngine):
    NAME = "vllm"

    def __init__(self, config: VllmConfig) -> None:
        super().__init__(config.validate(), config.url)
        self._client = httpx.AsyncClient(base_url=config.url, timeout=httpx.Timeout(30.0, connect=5.0))
        self._responses: dict[str, httpx.Response] = {}  # open generate streams, by request id
        self._aborted: set[str] = set()
        self._native = VllmNixl(self) if config.kv_connector == "nixl" else None

    # -- ExternalEngine ---------------------------------------------------------------------------

    async def describe(self) -> ServerDescription:
        try:
            models = await self._client.get("/v1/models")
            metrics = await self._client.get("/metrics")
        except httpx.TransportError as e:
            raise EngineUnreachable(str(e) or type(e).__name__) from None
        if models.status_code != 200 or metrics.status_code != 200:
            raise EngineUnreachable(f"/v1/models answered {models.status_code}, /metrics {metrics.status_code}")
        entries = models.json().get("data") or []
        if not entries:
            raise RuntimeError(f"the vLLM server at {self.endpoint} serves no model")
        model = entries[0]
        parsed = api.parse_metrics(metrics.text)
        if not parsed.prefix_caching:
            raise RuntimeError("the vLLM server runs without prefix caching: start it with --enable-prefix-caching")
        return ServerDescription(
            served_model=model["id"],
            model_path=model.get("root") or model["id"],
            block_size=parsed.block_size,
            kv_dtype=parsed.cache_dtype,
            max_context=int(model.get("max_model_len") or 0),
            num_total_blocks=parsed.num_total_blocks,
        )

    async def read_load(self) -> LoadSample:
        response = await self._client.get("/metrics", timeout=2.0)
        response.raise_for_status()
        parsed = api.parse_metrics(response.text)
        return LoadSample(parsed.num_running, parsed.num_waiting, round(parsed.kv_cache_usage * parsed.num_total_blocks))

    async def flush_cache(self) -> bool:
        # /reset_prefix_cache exists only on a server started with VLLM_SERVER_DEV_MODE=1.
        response = await self._client.post("/reset_prefix_cache")
        return response.status_code == 200

    async def close(self) -> None:
        for request_id in list(self._responses):
            self.abort(request_id)
        await self._client.aclose()

    # -- EngineAdapter ------------------------------------------------------------------------------

    @property
    def native_transfer(self) -> NativeKVTransfer | None:
        return self._native

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if request.held_block_ids:
            raise EngineInputError("the vllm engine does not import KV through kvplane's transports (held_block_ids)")
        if request.prefill_only:
            raise EngineInputError("the vllm engine prefills for a peer only through its KV connector (native_transfer.prefill)")
        body = api.completion_body(request, self.info.model, stream=True, cache_salt=self.salts.alias(request.cache_salt))
        if request.native_handoff:
            if self._native is None:
                raise EngineInputError("this vLLM server runs no KV connector: it cannot decode after a remote prefill")
            body["kv_transfer_params"] = nixl.decode_params(request.native_handoff)
        http_request = self._client.build_request("POST", "/v1/completions", json=body, headers={"X-Request-Id": request.request_id})
        try:
            response = await self._client.send(http_request, stream=True)
        except httpx.TransportError as e:
            return _failed(request, f"the vLLM server at {self.endpoint} did not take the request: {e or type(e).__name__}")
        if response.status_code != 200:
            message = api.error_message(response.status_code, await response.aread())
            await response.aclose()
            if response.status_code == 400:
                # vLLM refuses a prompt longer than its context with 400 as well: the request itself is at fault.
                raise EngineInputError(f"the vLLM server refused the request: {message}")
            raise EngineCapacityError(f"the vLLM server could not take the request: {message}")
        self._responses[request.request_id] = response
        self.inflight.started(request.request_id, len(request.prompt_token_ids), request.sampling.max_tokens)
        return self._stream(request, response)

    async def _stream(self, request: EngineRequest, response: httpx.Response) -> AsyncIterator[EngineOutput]:
        request_id, num_prompt = request.request_id, len(request.prompt_token_ids)
        reason: str | None = None
        error: str | None = None
        num_cached = 0
        try:
            try:
                async for line in response.aiter_lines():
                    chunk = api.parse_sse_line(line)
                    if chunk is None:
                        continue
                    if chunk.done:
                        break
                    if chunk.num_prompt_tokens is not None:
                        num_prompt, num_cached = chunk.num_prompt_tokens, chunk.num_cached_tokens or 0
                    if chunk.error:
                        reason, error = "error", chunk.error
                        break
                    reason = chunk.finish_reason or reason
                    if chunk.token_ids:
                        self.inflight.progressed(request_id, len(chunk.token_ids))
                        yield EngineOutput(request_id, chunk.token_ids, False, None, num_prompt, num_cached)
            except (httpx.TransportError, httpx.StreamError, api.ApiError) as e:
                if request_id in self._aborted:
                    reason = "abort"
                else:
                    reason, error = "error", f"the vLLM stream broke: {e or type(e).__name__}"
            if reason is None:
                reason = "abort" if request_id in self._aborted else "error"
                error = None if reason == "abort" else "the vLLM stream ended without a finish reason"
            yield EngineOutput(request_id, [], True, reason, num_prompt, num_cached, error=error)
        finally:
            self._responses.pop(request_id, None)
            self._aborted.discard(request_id)
            self.inflight.ended(request_id)
            await response.aclose()

    def abort(self, request_id: str) -> None:
        response = self._responses.get(request_id)
        if response is None:
            return
        self._aborted.add(request_id)
        # Closing the stream drops the connection; vLLM aborts a request whose client went away.
        asyncio.get_running_loop().create_task(response.aclose())

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        if not token_ids:
            return ""
        response = await self._client.post("/detokenize", json={"model": self.info.model, "tokens": list(token_ids)})
        response.raise_for_status()
        return response.json()["prompt"]


class VllmNixl:
    """Prefill side of disaggregation through vLLM's NixlConnector (see nixl.py)."""

    transport = nixl.TRANSPORT

    def __init__(self, adapter: VllmAdapter) -> None:
        self._adapter = adapter

    async def prefill(self, request: EngineRequest) -> NativeHandoff:
        adapter = self._adapter
        body = nixl.prefill_body(request, adapter.info.model, cache_salt=adapter.salts.alias(request.cache_salt))
        adapter.inflight.started(request.request_id, len(request.prompt_token_ids), 0)
        try:
            response = await adapter._client.post(
                "/v1/completions", json=body, headers={"X-Request-Id": request.request_id}, timeout=httpx.Timeout(None, connect=5.0)
            )
        except httpx.TransportError as e:
            raise RuntimeError(f"the vLLM server at {adapter.endpoint} did not answer: {e or type(e).__name__}") from None
        finally:
            adapter.inflight.ended(request.request_id)
        if response.status_code == 400:
            raise EngineInputError(f"the vLLM server refused the prefill: {api.error_message(400, response.content)}")
        if response.status_code != 200:
            raise RuntimeError(f"the vLLM prefill failed: {api.error_message(response.status_code, response.content)}")
        try:
            return nixl.handoff_from_response(response.json(), len(request.prompt_token_ids))
        except api.ApiError as e:
            raise RuntimeError(str(e)) from None


async def _failed(request: EngineRequest, error: str) -> AsyncIterator[EngineOutput]:
    yield EngineOutput(request.request_id, [], True, "error", len(request.prompt_token_ids), 0, error=error)
