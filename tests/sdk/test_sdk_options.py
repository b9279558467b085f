"""RequestOptions: checked once when built, reusable across calls, overridden field by field."""

from __future__ import annotations

import dataclasses

import pytest

from kvplane.client import RequestFields, RequestOptions, build_request
from kvplane.client.request import request_options
from kvplane.types import DisaggMode
from kvplane.v1 import common_pb2


def test_values_are_normalised_when_built() -> None:
    options = RequestOptions(max_tokens=4, temperature=1, stop_token_ids=[3, 4], disagg="never", ignore_eos=1)  # type: ignore[arg-type]
    assert (options.disagg, options.stop_token_ids, options.temperature, options.ignore_eos) == (
        DisaggMode.NEVER, (3, 4), 1.0, True,
    )  # fmt: skip
    assert type(options.temperature) is float
    # Normalised values make equal options equal, and hashable, whatever form they were given in.
    same = RequestOptions(max_tokens=4, temperature=1.0, stop_token_ids=(3, 4), disagg=DisaggMode.NEVER, ignore_eos=True)
    assert options == same and hash(options) == hash(same)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_tokens": -1}, ValueError, "max_tokens must be between 0 and 4294967295, got -1"),
        ({"seed": 2**64}, ValueError, f"seed must be between 0 and {2**64 - 1}, got {2**64}"),
        ({"top_k": True}, TypeError, "top_k must be an int, got bool"),
        ({"stop_token_ids": "ab"}, TypeError, r"stop_token_ids\[\] must be an int, got str"),
        ({"disagg": "maybe"}, ValueError, "disagg must be one of 'auto', 'always', 'never', got 'maybe'"),
        ({"priority": "urgent"}, ValueError, "priority must be one of 'interactive', 'batch', got 'urgent'"),
    ],
)
def test_a_bad_value_fails_when_the_options_are_built(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        RequestOptions(**kwargs)


def test_keyword_fields_override_the_options_and_leave_them_unchanged() -> None:
    base = RequestOptions(max_tokens=4, cache_salt="tenant-a", priority="batch")
    merged = request_options(base, {"max_tokens": 8, "disagg": "always"})
    assert merged == RequestOptions(max_tokens=8, cache_salt="tenant-a", priority="batch", disagg=DisaggMode.ALWAYS)
    assert base.max_tokens == 4 and base.disagg is DisaggMode.AUTO
    assert request_options(base, {}) is base  # nothing to override: the same instance
    assert request_options(None, None) == RequestOptions()
    with pytest.raises(ValueError, match="max_tokens must be between"):
        request_options(base, {"max_tokens": -2})  # an override is checked like a constructor argument


def test_unknown_fields_and_wrong_options_type_are_refused() -> None:
    with pytest.raises(TypeError) as info:
        request_options(None, {"max_token": 3, "temp": 1})
    assert str(info.value) == (
        "unknown request option(s) max_token, temp; known: max_tokens, temperature, top_p, top_k, seed, "
        "stop_token_ids, ignore_eos, disagg, model, cache_salt, request_id, priority, lookaside, stream_interval"
    )
    with pytest.raises(TypeError, match="^options must be a RequestOptions, got dict$"):
        request_options({"max_tokens": 3}, None)  # type: ignore[arg-type]


def test_the_keyword_form_lists_exactly_the_option_fields() -> None:
    # The clients' **fields are typed by RequestFields; it must not drift from the dataclass.
    assert list(RequestFields.__annotations__) == [f.name for f in dataclasses.fields(RequestOptions)]


def test_one_options_instance_serves_many_prompts() -> None:
    options = RequestOptions(max_tokens=2, seed=0, model="m", request_id="", disagg="never")
    first, second = options.to_proto("hello"), options.to_proto([7, 8])
    assert (first.text, list(second.token_ids.ids)) == ("hello", [7, 8])
    for request in (first, second):
        assert (request.sampling.max_tokens, request.sampling.seed, request.model) == (2, 0, "m")
        assert request.sampling.HasField("seed")  # seed 0 is sent, not dropped
        assert request.disagg == common_pb2.DISAGG_MODE_NEVER
    assert build_request("hello", options) == first
    assert build_request("hello", options, max_tokens=5).sampling.max_tokens == 5


def test_chat_messages_become_a_chat_prompt() -> None:
    request = RequestOptions(max_tokens=4).to_proto([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert request.WhichOneof("prompt") == "chat"
    assert [(m.role, m.content) for m in request.chat.messages] == [("system", "be brief"), ("user", "hi")]
    with pytest.raises(TypeError, match="chat messages"):
        RequestOptions().to_proto(42)  # type: ignore[arg-type]
