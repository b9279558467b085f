"""build_request: what goes on the wire, and the few checks only the client can make."""

from __future__ import annotations

import pytest

from kvplane.client import build_request
from kvplane.types import DisaggMode
from kvplane.v1 import common_pb2


def test_text_prompt_and_every_option_reach_the_request() -> None:
    request = build_request(
        "hi", max_tokens=7, temperature=0.5, top_p=0.9, top_k=40, seed=123, stop_token_ids=(3, 4),
        ignore_eos=True, disagg="always", model="m", cache_salt="tenant-a", request_id="r1",
    )  # fmt: skip
    assert request.WhichOneof("prompt") == "text" and request.text == "hi"
    s = request.sampling
    assert (s.max_tokens, s.top_k, s.seed, list(s.stop_token_ids), s.ignore_eos) == (7, 40, 123, [3, 4], True)
    assert s.temperature == pytest.approx(0.5) and s.top_p == pytest.approx(0.9)
    assert request.disagg == common_pb2.DISAGG_MODE_ALWAYS
    assert (request.model, request.cache_salt, request.request_id) == ("m", "tenant-a", "r1")


def test_token_prompt_and_defaults() -> None:
    request = build_request([5, 6, 7])
    assert request.WhichOneof("prompt") == "token_ids" and list(request.token_ids.ids) == [5, 6, 7]
    assert request.sampling.max_tokens == 16
    assert not request.sampling.HasField("seed")  # None means "not set", not seed 0
    assert request.disagg == common_pb2.DISAGG_MODE_AUTO


def test_disagg_accepts_the_enum() -> None:
    assert build_request("x", disagg=DisaggMode.NEVER).disagg == common_pb2.DISAGG_MODE_NEVER


def test_unknown_disagg_names_the_accepted_values() -> None:
    with pytest.raises(ValueError, match=r"disagg must be one of 'auto', 'always', 'never', got 'sometimes'"):
        build_request("x", disagg="sometimes")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": -1}, "max_tokens must be between 0 and"),
        ({"top_k": 2**32}, "top_k must be between 0 and"),
        ({"seed": -3}, "seed must be between 0 and"),
        ({"stop_token_ids": [1, -2]}, r"stop_token_ids\[\] must be between"),
    ],
)
def test_values_the_wire_cannot_carry_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_request("x", **kwargs)


def test_prompt_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match="prompt must be a str, a sequence of token ids or chat messages, got bytes"):
        build_request(b"raw")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prompt token id must be between"):
        build_request([1, -1])
