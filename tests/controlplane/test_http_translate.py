"""The HTTP face's translation, without a server: bodies to Generate requests, stop strings,
status mapping, usage."""

from __future__ import annotations

import grpc
import pytest
from pydantic import ValidationError

from kvplane.controlplane.http import translate as t
from kvplane.controlplane.http.schemas import ChatCompletionRequest, CompletionRequest
from kvplane.errors import ERROR_KIND_KEY, RETRY_AFTER_MS_KEY, UNKNOWN_MODEL
from kvplane.v1 import common_pb2


def test_a_completion_body_becomes_one_generate_request_per_prompt():
    body = CompletionRequest(
        model="m", prompt=["a", "b"], max_tokens=5, temperature=0, seed=7, cache_salt="s", priority="batch", disagg="never"
    )
    first, second = t.completion_requests(body, "rid")
    assert (first.text, second.text, first.request_id, second.request_id) == ("a", "b", "rid-0", "rid-1")
    assert (first.model, first.sampling.max_tokens, first.sampling.temperature, first.sampling.seed) == ("m", 5, 0.0, 7)
    assert (first.cache_salt, first.priority, first.disagg) == ("s", "batch", common_pb2.DISAGG_MODE_NEVER)
    (ids,) = t.completion_requests(CompletionRequest(model="m", prompt=[1, 2, 3]), "r")
    assert list(ids.token_ids.ids) == [1, 2, 3] and ids.request_id == "r" and ids.sampling.max_tokens == 16
    assert [list(r.token_ids.ids) for r in t.completion_requests(CompletionRequest(model="m", prompt=[[1], [2, 3]]), "r")] == [[1], [2, 3]]


def test_chat_messages_travel_as_a_chat_prompt():
    body = ChatCompletionRequest(
        model="m", messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    )
    request = t.chat_request(body, "r")
    assert [(m.role, m.content) for m in request.chat.messages] == [("system", "be brief"), ("user", "hi")]
    # No max_tokens (chat's default): as many as the model allows after the prompt.
    assert request.sampling.max_tokens == 0 and request.max_tokens_to_limit
    assert not t.chat_request(
        ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3), "r"
    ).max_tokens_to_limit
    with pytest.raises(t.HttpError, match="image_url"):
        t.chat_request(ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "r")


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": 3}, "logprobs"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"best_of": 2}, "best_of"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"modalities": ["audio"]}, "modalities"),
    ],
)
def test_unsupported_fields_are_refused_by_name(extra, field):
    with pytest.raises(t.HttpError) as info:
        t.completion_requests(CompletionRequest(model="m", prompt="x", **extra), "r")
    assert info.value.status == 400 and field in info.value.message


def test_neutral_values_of_unsupported_fields_pass():
    t.completion_requests(
        CompletionRequest(model="m", prompt="x", n=1, logprobs=None, frequency_penalty=0, presence_penalty=0, user="u"), "r"
    )
    t.completion_requests(CompletionRequest(model="m", prompt="x", response_format={"type": "text"}, tool_choice="none"), "r")


def test_bodies_are_validated():
    for bad in ({"prompt": "x", "temperature": 3}, {"prompt": "x", "max_tokens": 0}, {"prompt": "x", "stop": ["a"] * 5}, {}):
        with pytest.raises(ValidationError):
            CompletionRequest(model="m", **bad)
    with pytest.raises(t.HttpError, match="prompt is empty"):
        t.completion_requests(CompletionRequest(model="m", prompt=[]), "r")


def test_stop_strings_cut_the_text_and_never_leak_a_partial_match():
    f = t.StopFilter(["END", "\n\n"])
    assert f.push("hello E") == "hello "  # "E" may begin "END": held back
    assert f.push("N") == ""
    assert f.push("Dx more") == "" and f.stopped  # "END" matched: nothing after it
    g = t.StopFilter(["END"])
    assert g.push("EN") == "" and g.push("OUGH", final=False) == "ENOUGH" and not g.stopped
    assert g.push("E", final=True) == "E"  # the end releases what was held back
    assert t.StopFilter([]).push("anything") == "anything"


class _RpcError(grpc.aio.AioRpcError):
    def __init__(self, code, details, trailers=()):
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailers), details)


def test_status_codes_map_to_openai_http_errors():
    rejected = t.error_from_rpc(_RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", [(RETRY_AFTER_MS_KEY, "1500")]))
    assert (rejected.status, rejected.headers, rejected.code) == (429, {"Retry-After": "2"}, "rate_limit_exceeded")
    unknown = t.error_from_rpc(_RpcError(grpc.StatusCode.INVALID_ARGUMENT, "unknown model 'x'", [(ERROR_KIND_KEY, UNKNOWN_MODEL)]))
    assert (unknown.status, unknown.code) == (404, "model_not_found")
    assert t.error_from_rpc(_RpcError(grpc.StatusCode.INVALID_ARGUMENT, "bad")).status == 400
    assert t.error_from_rpc(_RpcError(grpc.StatusCode.UNAVAILABLE, "no workers")).status == 503
    assert t.error_from_rpc(_RpcError(grpc.StatusCode.UNAUTHENTICATED, "who")).status == 401
    assert t.error_from_rpc(_RpcError(grpc.StatusCode.INTERNAL, "oops")).body() == {
        "error": {"message": "oops", "type": "server_error", "param": None, "code": "internal"}
    }


def test_usage_counts_cached_prompt_tokens():
    metrics = common_pb2.RequestMetrics(prompt_tokens=40, cached_tokens=32, decode_worker="d")
    choices = [t.ChoiceResult(0, "ab", 2, "stop", metrics)]
    assert t.usage(choices) == {
        "prompt_tokens": 40,
        "completion_tokens": 2,
        "total_tokens": 42,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    assert t.routing_headers("r", choices)["x-kvplane-cached-tokens"] == "32"
    assert t.finish_reason("length") == "length" and t.finish_reason("eos") == "stop"
