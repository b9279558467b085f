"""The vLLM OpenAI-compatible server's messages that the adapter sends and reads (pure).

Generate is POST /v1/completions with the prompt as token ids, streamed as server-sent events,
with `return_token_ids` (each chunk's `choices[0].token_ids`) and a final usage chunk
(`stream_options.include_usage`; `prompt_tokens_details.cached_tokens` when the server runs with
--enable-prompt-tokens-details). Finish reasons: "length"; "stop" with `stop_reason` null is the
end-of-sequence token ("eos"), with a token id a stop token ("stop"); "abort".
Load is /metrics: vllm:num_requests_running / _waiting, vllm:kv_cache_usage_perc and the
`vllm:cache_config_info` labels (block_size, num_gpu_blocks, cache_dtype, enable_prefix_caching).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvplane.dataplane.engines.external import prometheus
from kvplane.dataplane.engines.request import EngineRequest


class ApiError(ValueError):
    """A message that is not what this vLLM version sends."""


def completion_body(request: EngineRequest, model: str, *, stream: bool, cache_salt: str = "") -> dict:
    sampling = request.sampling
    body: dict = {
        "model": model,
        "prompt": list(request.prompt_token_ids),
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "ignore_eos": sampling.ignore_eos,
        "stream": stream,
        "return_token_ids": True,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if sampling.top_k > 0:
        body["top_k"] = sampling.top_k
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    if cache_salt:  # vLLM's cache_salt rules: an alias of the request's salt (external/salts.py)
        body["cache_salt"] = cache_salt
    return body


@dataclass(slots=True)
class Chunk:
    """One streamed event, reduced to what the adapter uses."""

    token_ids: list[int]
    finish_reason: str | None = None  # kvplane's: "length" | "stop" | "eos" | "abort" | "error"
    num_prompt_tokens: int | None = None  # from the usage chunk
    num_cached_tokens: int | None = None
    error: str | None = None
    done: bool = False  # the [DONE] marker


def parse_sse_line(line: str) -> Chunk | None:
    """One line of the event stream; None for lines that carry nothing (blank, comments)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return Chunk([], done=True)
    try:
        event = json.loads(data)
    except json.JSONDecodeError as e:
        raise ApiError(f"an event that is not JSON: {data[:200]!r} ({e})") from None
    if "error" in event:
        error = event["error"]
        return Chunk([], finish_reason="error", error=error.get("message", str(error)) if isinstance(error, dict) else str(error))
    chunk = Chunk([])
    usage = event.get("usage")
    if usage:
        chunk.num_prompt_tokens = int(usage.get("prompt_tokens") or 0)
        chunk.num_cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    for choice in event.get("choices") or ():
        if choice.get("token_ids") is None and choice.get("text"):
            raise ApiError("a chunk with text but no token_ids: this vLLM does not honour return_token_ids")
        chunk.token_ids.extend(int(t) for t in choice.get("token_ids") or ())
        if choice.get("finish_reason"):
            chunk.finish_reason = finish_reason(choice["finish_reason"], choice.get("stop_reason"))
    return chunk


def finish_reason(reason: str, stop_reason: object) -> str:
    if reason == "stop":
        return "eos" if stop_reason is None else "stop"
    if reason in ("length", "abort"):
        return reason
    return "error"


def error_message(status: int, body: bytes) -> str:
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"HTTP {status}: {body[:300]!r}"
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    message = error.get("message") if isinstance(error, dict) else None
    return f"HTTP {status}: {message or error}"


@dataclass(frozen=True, slots=True)
class Metrics:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 0..1
    block_size: int
    num_total_blocks: int
    cache_dtype: str
    prefix_caching: bool


def parse_metrics(text: str) -> Metrics:
    samples = list(prometheus.parse(text))
    info = prometheus.first(samples, "vllm:cache_config_info")
    if info is None:
        raise ApiError("/metrics has no vllm:cache_config_info: not a vLLM server, or a version kvplane does not know")
    labels = info.labels
    usage = prometheus.first(samples, "vllm:kv_cache_usage_perc") or prometheus.first(samples, "vllm:gpu_cache_usage_perc")
    return Metrics(
        num_running=int(prometheus.total(samples, "vllm:num_requests_running")),
        num_waiting=int(prometheus.total(samples, "vllm:num_requests_waiting")),
        kv_cache_usage=usage.value if usage else 0.0,
        block_size=int(labels.get("block_size") or 0),
        num_total_blocks=int(labels.get("num_gpu_blocks") or 0) if labels.get("num_gpu_blocks", "None") != "None" else 0,
        cache_dtype=labels.get("cache_dtype", "auto"),
        prefix_caching=labels.get("enable_prefix_caching") == "True",
    )
