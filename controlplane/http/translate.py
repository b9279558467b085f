"""OpenAI bodies to Kvplane.Generate requests, and Generate replies back to OpenAI objects.

Plain functions over protobuf messages and dicts (no HTTP, no gRPC calls), tested directly.
- Stop strings are matched on the streamed text: text that could still be the start of a stop
  string is held back until it cannot, so a client never sees part of one; on a match the text
  is cut before it and the request ends with finish_reason "stop" (as vLLM does).
- finish reasons map to OpenAI's: length -> "length"; eos, stop token, stop string -> "stop".
- gRPC status codes map to HTTP ones with OpenAI's error object {"error": {message, type, code}}.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import grpc

from kvplane.client.request import COLLECTED_STREAM_INTERVAL
from kvplane.controlplane.http.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from kvplane.errors import ERROR_KIND_KEY, RETRY_AFTER_MS_KEY, UNKNOWN_MODEL
from kvplane.v1 import client_pb2, common_pb2

_DISAGG = {"auto": common_pb2.DISAGG_MODE_AUTO, "never": common_pb2.DISAGG_MODE_NEVER, "always": common_pb2.DISAGG_MODE_ALWAYS}


class HttpError(Exception):
    """An answer other than 200: status, OpenAI error type and code, message, extra headers."""

    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None, headers: dict | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.headers = status, message, type_, code, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}


def _sampling(body: SamplingFields) -> common_pb2.SamplingParams:
    max_tokens = body.max_completion_tokens or body.max_tokens
    sampling = common_pb2.SamplingParams(
        max_tokens=max_tokens or 0,  # 0: as many as the model allows (max_tokens_to_limit)
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        ignore_eos=body.ignore_eos,
    )
    if body.seed is not None:
        sampling.seed = body.seed
    return sampling


def _base_request(body: SamplingFields, request_id: str) -> client_pb2.GenerateRequest:
    sampling = _sampling(body)
    return client_pb2.GenerateRequest(
        model=body.model,
        sampling=sampling,
        disagg=_DISAGG[body.disagg],
        request_id=request_id,
        cache_salt=body.cache_salt,
        priority=body.priority,
        max_tokens_to_limit=sampling.max_tokens == 0,  # no max_tokens: up to the model's limit
        # Without "stream" the answer goes out whole: larger chunks from the worker cost less.
        stream_interval=0 if body.stream else COLLECTED_STREAM_INTERVAL,
    )


def check_supported(body: SamplingFields) -> None:
    unsupported = body.unsupported_fields()
    if unsupported:
        raise HttpError(
            400, f"kvplane does not support {', '.join(unsupported)}; leave them out (n must be 1)", code="unsupported_parameter"
        )


def completion_requests(body: CompletionRequest, request_id: str) -> list[client_pb2.GenerateRequest]:
    """One Generate request per prompt (a list of prompts gives one choice each)."""
    check_supported(body)
    prompts = body.prompts()
    if not prompts:
        raise HttpError(400, "prompt is empty: send a text, a list of texts or token ids")
    out = []
    for i, prompt in enumerate(prompts):
        request = _base_request(body, request_id if len(prompts) == 1 else f"{request_id}-{i}")
        if isinstance(prompt, str):
            request.text = prompt
        else:
            if any(t < 0 or t >= 2**32 for t in prompt):
                raise HttpError(400, "token ids must be in [0, 2^32)")
            request.token_ids.ids.extend(prompt)
        out.append(request)
    return out


def chat_request(body: ChatCompletionRequest, request_id: str) -> client_pb2.GenerateRequest:
    check_supported(body)
    request = _base_request(body, request_id)
    try:
        for m in body.messages:
            request.chat.messages.add(role=m.role, content=m.text())
    except ValueError as e:
        raise HttpError(400, str(e)) from None
    return request


def error_from_rpc(e: grpc.aio.AioRpcError) -> HttpError:
    code, details = e.code(), e.details() or e.code().name
    trailers = dict(e.trailing_metadata() or ())
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        retry_ms = trailers.get(RETRY_AFTER_MS_KEY)
        headers = {"Retry-After": str(max(1, math.ceil(float(retry_ms) / 1000)))} if retry_ms else {}
        return HttpError(429, details, "rate_limit_exceeded", "rate_limit_exceeded", headers)
    if trailers.get(ERROR_KIND_KEY) == UNKNOWN_MODEL:
        return HttpError(404, details, "invalid_request_error", "model_not_found")
    status, type_ = {
        grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
        grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),
        grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
        grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error"),
        grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
        grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
        grpc.StatusCode.UNAVAILABLE: (503, "server_error"),
        grpc.StatusCode.DEADLINE_EXCEEDED: (504, "server_error"),
        grpc.StatusCode.CANCELLED: (499, "server_error"),
    }.get(code, (500, "server_error"))
    return HttpError(status, details, type_, code.name.lower())


def finish_reason(kvplane_reason: str) -> str:
    return "length" if kvplane_reason == "length" else "stop"


class StopFilter:
    """Cuts streamed text at the first stop string; holds back what may begin one."""

    __slots__ = ("_stops", "_pending", "stopped")

    def __init__(self, stops: list[str]) -> None:
        self._stops = stops
        self._pending = ""
        self.stopped = False

    def push(self, text: str, final: bool = False) -> str:
        """The text that is safe to send now (everything, when `final`)."""
        if self.stopped:
            return ""
        self._pending += text
        if not self._stops:
            out, self._pending = self._pending, ""
            return out
        hits = [i for i in (self._pending.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self._pending = self._pending[: min(hits)], ""
            return out
        if final:
            out, self._pending = self._pending, ""
            return out
        keep = max((k for s in self._stops for k in range(1, len(s)) if self._pending.endswith(s[:k])), default=0)
        cut = len(self._pending) - keep
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out


@dataclass(slots=True)
class ChoiceResult:
    """One finished choice: its text, tokens, finish reason and the request's metrics."""

    index: int
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    metrics: common_pb2.RequestMetrics | None = None


def usage(choices: list[ChoiceResult]) -> dict:
    prompt = sum(c.metrics.prompt_tokens for c in choices if c.metrics)
    cached = sum(c.metrics.cached_tokens for c in choices if c.metrics)
    completion = sum(c.num_tokens for c in choices)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def routing_facts(metrics: common_pb2.RequestMetrics | None) -> dict:
    """What kvplane did with a request: the `x-kvplane-*` headers and the `kvplane` field."""
    if metrics is None:
        return {}
    return {
        "decode_worker": metrics.decode_worker,
        "prefill_worker": metrics.prefill_worker or metrics.decode_worker,
        "disaggregated": metrics.disaggregated,
        "cached_tokens": metrics.cached_tokens,
        "kv_transfer_bytes": metrics.kv_transfer_bytes,
        "ttft_ms": round(metrics.ttft_ms, 3),
        "route_reason": metrics.route_reason,
    }


def routing_headers(request_id: str, choices: list[ChoiceResult]) -> dict[str, str]:
    headers = {"x-kvplane-request-id": request_id}
    facts = routing_facts(choices[0].metrics) if len(choices) == 1 else {}
    for key in ("decode_worker", "prefill_worker", "cached_tokens", "kv_transfer_bytes"):
        if key in facts:
            headers[f"x-kvplane-{key.replace('_', '-')}"] = str(facts[key])
    return headers


def now() -> int:
    return int(time.time())
