"""The HTTP routes: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

Each completion is one or more `Kvplane.Generate` calls on the replica's own gRPC service
(`stub`), carrying the caller's `Authorization` header as gRPC metadata. A client that goes away
cancels its calls: the control plane then aborts the request on its engine and releases its pins.

The app runs behind `guard.BodyGuard`, so a route sees only authenticated callers and bodies of
bounded size; it parses them with `guard.parse_body` (bounded cost, 400 on anything malformed).
/health answers from one ListWorkers call per HEALTH_CACHE_S, made as the replica itself: probes
and anonymous callers, however many, never spend the clients' rate limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from kvplane.controlplane.http import translate as t
from kvplane.controlplane.http.guard import BodyGuard, BodyLimits, parse_body, validation_problems
from kvplane.controlplane.http.schemas import ChatCompletionRequest, CompletionRequest
from kvplane.security.auth import Authenticator
from kvplane.telemetry.metrics import instruments
from kvplane.v1 import client_pb2, client_pb2_grpc

log = logging.getLogger(__name__)

_DONE = "data: [DONE]\n\n"
HEALTH_CACHE_S = 1.0


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class _Stream:
    """One Generate call's replies, with stop strings applied; cancels the call when closed."""

    def __init__(
        self, stub: client_pb2_grpc.KvplaneStub, request: client_pb2.GenerateRequest, metadata, stops: list[str], index: int
    ) -> None:
        self.call = stub.Generate(request, metadata=metadata)
        self.filter = t.StopFilter(stops)
        self.result = t.ChoiceResult(index)

    async def deltas(self) -> AsyncIterator[str]:
        """Text deltas; sets `result` as they come. Raises grpc.aio.AioRpcError on failure."""
        async for reply in self.call:
            self.result.num_tokens += len(reply.token_ids)
            text = self.filter.push(reply.text, final=reply.finished)
            if self.filter.stopped:
                self.result.finish_reason = "stop"
                self.call.cancel()  # the rest of the answer is not wanted
                if text:
                    self.result.text += text
                    yield text
                return
            if reply.finished:
                self.result.finish_reason = t.finish_reason(reply.finish_reason)
                self.result.metrics = reply.metrics
            if text:
                self.result.text += text
                yield text

    def cancel(self) -> None:
        self.call.cancel()


def make_app(
    stub_factory: Callable[[], client_pb2_grpc.KvplaneStub],
    metrics_text: Callable[[], bytes],
    authenticator: Authenticator | None = None,
    body_limits: BodyLimits | None = None,
) -> BodyGuard:
    """The routes behind the guard (`authenticator` None: every caller passes to gRPC's own check)."""
    app = FastAPI(title="kvplane", description="OpenAI-compatible API of a kvplane control plane", docs_url=None, redoc_url=None)

    def count(route: str, status: int) -> None:
        instruments().kvplane_http_requests.add(1, {"http.route": route, "http.response.status_code": status})

    def metadata_of(request: Request) -> tuple[tuple[str, str], ...]:
        auth = request.headers.get("authorization")
        return (("authorization", auth),) if auth else ()

    def error_response(route: str, e: t.HttpError) -> JSONResponse:
        count(route, e.status)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request.url.path, t.HttpError(400, f"invalid request body: {validation_problems(list(exc.errors()))}"))

    async def run(
        route: str, request: Request, generate_requests: list[client_pb2.GenerateRequest], body, chat: bool, request_id: str
    ) -> Response:
        stub = stub_factory()
        metadata = metadata_of(request)
        streams = [_Stream(stub, r, metadata, body.stop_strings(), i) for i, r in enumerate(generate_requests)]
        kind = "chat.completion" if chat else "text_completion"
        response_id = ("chatcmpl-" if chat else "cmpl-") + request_id
        created = t.now()
        model = body.model

        def envelope(obj: str) -> dict:
            return {"id": response_id, "object": obj, "created": created, "model": model}

        if body.stream:
            # Fail before the 200 goes out when the first reply is an error (rejected, bad input).
            queue: asyncio.Queue = asyncio.Queue()

            async def pump(stream: _Stream) -> None:
                try:
                    async for delta in stream.deltas():
                        await queue.put((stream, delta))
                    await queue.put((stream, None))
                except grpc.aio.AioRpcError as e:
                    await queue.put((stream, e))

            tasks = [asyncio.create_task(pump(s)) for s in streams]
            first = await queue.get()
            if isinstance(first[1], grpc.aio.AioRpcError):
                for s in streams:
                    s.cancel()
                for task in tasks:
                    task.cancel()
                return error_response(route, t.error_from_rpc(first[1]))
            count(route, 200)
            return StreamingResponse(
                _sse_events(first, queue, streams, tasks, envelope, kind, chat, body.include_usage()),
                media_type="text/event-stream",
                headers={"x-kvplane-request-id": request_id, "cache-control": "no-cache"},
            )

        async def collect(stream: _Stream) -> None:
            async for _ in stream.deltas():
                pass

        gathered = asyncio.ensure_future(asyncio.gather(*(collect(s) for s in streams)))
        # A client that disconnects mid-request cancels its calls (their pins are released).
        while not gathered.done():
            done, _ = await asyncio.wait({gathered}, timeout=0.25)
            if not done and await request.is_disconnected():
                for s in streams:
                    s.cancel()
                gathered.cancel()
                count(route, 499)
                return Response(status_code=499)
        try:
            gathered.result()
        except grpc.aio.AioRpcError as e:
            for s in streams:
                s.cancel()
            return error_response(route, t.error_from_rpc(e))
        choices = [s.result for s in streams]
        out = envelope(kind)
        if chat:
            out["choices"] = [
                {"index": c.index, "message": {"role": "assistant", "content": c.text}, "logprobs": None, "finish_reason": c.finish_reason}
                for c in choices
            ]
        else:
            out["choices"] = [{"index": c.index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason} for c in choices]
        out["usage"] = t.usage(choices)
        if len(choices) == 1:
            out["kvplane"] = t.routing_facts(choices[0].metrics)
        count(route, 200)
        return JSONResponse(out, headers=t.routing_headers(request_id, choices))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        try:
            body = parse_body(await request.body(), CompletionRequest)
            request_id = body.request_id or uuid.uuid4().hex
            generate_requests = t.completion_requests(body, request_id)
        except t.HttpError as e:
            return error_response("/v1/completions", e)
        except (ValueError, TypeError) as e:  # a value its protobuf field cannot hold: the caller's, not ours
            return error_response("/v1/completions", t.HttpError(400, f"invalid request body: {str(e)[:200]}"))
        return await run("/v1/completions", request, generate_requests, body, False, request_id)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            body = parse_body(await request.body(), ChatCompletionRequest)
            request_id = body.request_id or uuid.uuid4().hex
            generate_request = t.chat_request(body, request_id)
        except t.HttpError as e:
            return error_response("/v1/chat/completions", e)
        except (ValueError, TypeError) as e:  # a value its protobuf field cannot hold: the caller's, not ours
            return error_response("/v1/chat/completions", t.HttpError(400, f"invalid request body: {str(e)[:200]}"))
        return await run("/v1/chat/completions", request, [generate_request], body, True, request_id)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        try:
            reply = await stub_factory().ListWorkers(client_pb2.ListWorkersRequest(), metadata=metadata_of(request), timeout=10)
        except grpc.aio.AioRpcError as e:
            return error_response("/v1/models", t.error_from_rpc(e))
        names = sorted({w.info.model for w in reply.workers})
        count("/v1/models", 200)
        return JSONResponse({"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "kvplane"} for n in names]})

    health_state = _HealthCache(stub_factory)

    @app.get("/health")
    async def health() -> Response:
        status, body = await health_state.get()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(metrics_text(), media_type="text/plain; version=0.0.4")

    return BodyGuard(app, authenticator, body_limits or BodyLimits())


class _HealthCache:
    """The /health answer, asked of the replica's own gRPC service at most once per HEALTH_CACHE_S
    (one call in flight; concurrent probes share it)."""

    def __init__(self, stub_factory: Callable[[], client_pb2_grpc.KvplaneStub], clock: Callable[[], float] = time.monotonic) -> None:
        self._stub_factory = stub_factory
        self._clock = clock
        self._answer: tuple[int, dict] | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()

    async def get(self) -> tuple[int, dict]:
        async with self._lock:
            if self._answer is None or self._clock() - self._at >= HEALTH_CACHE_S:
                self._answer = await self._ask()
                self._at = self._clock()
            return self._answer

    async def _ask(self) -> tuple[int, dict]:
        try:
            reply = await self._stub_factory().ListWorkers(client_pb2.ListWorkersRequest(), timeout=5)
        except grpc.aio.AioRpcError as e:
            return 503, {"status": "unavailable", "detail": e.details()}
        if not reply.workers:
            return 503, {"status": "unavailable", "detail": "no workers are registered"}
        return 200, {"status": "ok", "workers": len(reply.workers)}


async def _sse_events(
    first, queue: asyncio.Queue, streams: list[_Stream], tasks, envelope, kind: str, chat: bool, include_usage: bool
) -> AsyncIterator[str]:
    chunk_kind = "chat.completion.chunk" if chat else "text_completion"
    pending = len(streams)
    started: set[int] = set()

    def chunk(index: int, text: str | None, finish: str | None) -> dict:
        out = envelope(chunk_kind)
        if chat:
            delta: dict = {}
            if index not in started:
                delta["role"] = "assistant"
                started.add(index)
            if text:
                delta["content"] = text
            out["choices"] = [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]
        else:
            out["choices"] = [{"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}]
        return out

    item = first
    try:
        while True:
            stream, value = item
            if isinstance(value, grpc.aio.AioRpcError):
                # Headers are out: report the failure in-band, as OpenAI-compatible servers do.
                yield _sse(t.error_from_rpc(value).body())
                break
            if value is None:
                pending -= 1
                final = chunk(stream.result.index, None, stream.result.finish_reason or "stop")
                if len(streams) == 1:
                    final["kvplane"] = t.routing_facts(stream.result.metrics)
                yield _sse(final)
                if pending == 0:
                    if include_usage:
                        last = envelope(chunk_kind)
                        last["choices"] = []
                        last["usage"] = t.usage([s.result for s in streams])
                        yield _sse(last)
                    yield _DONE
                    break
            else:
                yield _sse(chunk(stream.result.index, value, None))
            item = await queue.get()
    finally:
        # Normal end, error, or the client went away (the response is cancelled): stop the calls.
        for s in streams:
            s.cancel()
        for task in tasks:
            task.cancel()
