"""Request-building core: the options of a request, checked once, and the messages they become.

`RequestOptions` is everything about a generate/route request except its prompt. It is checked
when it is built, so one instance can be reused across prompts and calls; the clients also take
its fields as keyword arguments (`client.generate(p, max_tokens=8)`), which override the fields of
an `options` instance when both are given. Arguments are checked here only where the server
cannot do it (a value that does not fit its wire type, a disagg mode name, a priority class);
everything else is the control plane's to validate, in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from kvplane.convert import disagg_to_pb
from kvplane.security.limits import MAX_STREAM_INTERVAL
from kvplane.types import PRIORITIES, DisaggMode
from kvplane.v1 import client_pb2, common_pb2

DEFAULT_PRIORITY = PRIORITIES[0]

_UINT32_MAX = 2**32 - 1
# What generate() asks for when the caller set no stream_interval: it keeps only the whole answer,
# and 16 tokens a message cost the control plane a fraction of one message per token.
COLLECTED_STREAM_INTERVAL = 16
_UINT64_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """Sampling, placement and identity of a request; a bad value raises ValueError/TypeError here.

    `disagg` may be given by name ("auto", "always", "never") and is kept as a DisaggMode;
    `stop_token_ids` may be any sequence of ints and is kept as a tuple.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None  # None: the server picks; 0 is a seed like any other
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    disagg: DisaggMode | str = DisaggMode.AUTO
    model: str = ""
    cache_salt: str = ""  # per-tenant prefix-cache isolation
    request_id: str = ""  # empty: the control plane makes one
    priority: str = DEFAULT_PRIORITY
    # Stream from the decode agent, not through the control plane (kvplane/client/lookaside.py);
    # generate/stream only: route() never runs the request.
    lookaside: bool = False
    # Tokens per streamed chunk after the first (0: every token as it comes; generate(), which
    # collects the answer, asks for COLLECTED_STREAM_INTERVAL). At most MAX_STREAM_INTERVAL.
    stream_interval: int = 0

    def __post_init__(self) -> None:
        _unsigned("max_tokens", self.max_tokens, _UINT32_MAX)
        _unsigned("stream_interval", self.stream_interval, MAX_STREAM_INTERVAL)
        _unsigned("top_k", self.top_k, _UINT32_MAX)
        stop = tuple(_unsigned("stop_token_ids[]", t, _UINT32_MAX) for t in self.stop_token_ids)
        if self.seed is not None:
            _unsigned("seed", self.seed, _UINT64_MAX)
        # Normalised once, so that equal options compare equal and the instance is hashable.
        object.__setattr__(self, "stop_token_ids", stop)
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "ignore_eos", bool(self.ignore_eos))
        object.__setattr__(self, "lookaside", bool(self.lookaside))
        object.__setattr__(self, "disagg", _disagg_mode(self.disagg))
        check_priority(self.priority)

    def to_proto(self, prompt: str | Sequence[int] | Sequence[Mapping[str, str]]) -> client_pb2.GenerateRequest:
        """The GenerateRequest for `prompt` (text, a sequence of token ids, or chat messages
        {"role", "content"} to render with the model's chat template) with these options."""
        sampling = common_pb2.SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
        )
        if self.seed is not None:
            sampling.seed = self.seed
        request = client_pb2.GenerateRequest(
            model=self.model,
            sampling=sampling,
            disagg=disagg_to_pb(self.disagg),
            request_id=self.request_id,
            cache_salt=self.cache_salt,
            priority=self.priority,
            stream_interval=self.stream_interval,
        )
        if isinstance(prompt, str):
            request.text = prompt
        elif isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
            raise TypeError(f"prompt must be a str, a sequence of token ids or chat messages, got {type(prompt).__name__}")
        elif prompt and all(isinstance(m, Mapping) for m in prompt):
            for m in prompt:
                request.chat.messages.add(role=str(m.get("role", "")), content=str(m.get("content", "")))
        else:
            request.token_ids.ids.extend(_unsigned("prompt token id", t, _UINT32_MAX) for t in prompt)
        return request


class RequestFields(TypedDict, total=False):
    """The fields of RequestOptions as keyword arguments (for `**fields: Unpack[RequestFields]`)."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop_token_ids: Sequence[int]
    ignore_eos: bool
    disagg: DisaggMode | str
    model: str
    cache_salt: str
    request_id: str
    priority: str
    lookaside: bool
    stream_interval: int


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(RequestOptions))


def request_options(options: RequestOptions | None = None, fields: Mapping[str, Any] | None = None) -> RequestOptions:
    """`options` (default: every default) with `fields` replacing some of its values, checked."""
    if options is not None and not isinstance(options, RequestOptions):
        raise TypeError(f"options must be a RequestOptions, got {type(options).__name__}")
    fields = fields or {}
    unknown = sorted(set(fields) - set(_FIELD_NAMES))
    if unknown:
        raise TypeError(f"unknown request option(s) {', '.join(unknown)}; known: {', '.join(_FIELD_NAMES)}")
    if options is None:
        return RequestOptions(**fields)
    return dataclasses.replace(options, **fields) if fields else options


def build_request(prompt: str | Sequence[int], options: RequestOptions | None = None, **fields: Any) -> client_pb2.GenerateRequest:
    """The GenerateRequest for `prompt`, `options` and keyword `fields`; raises only for what cannot go on the wire."""
    return request_options(options, fields).to_proto(prompt)


def build_profile_request(worker_id: str, max_prompt_tokens: int, max_batch: int) -> client_pb2.ProfileWorkerRequest:
    return client_pb2.ProfileWorkerRequest(
        worker_id=worker_id,
        max_prompt_tokens=_unsigned("max_prompt_tokens", max_prompt_tokens, _UINT32_MAX),
        max_batch=_unsigned("max_batch", max_batch, _UINT32_MAX),
    )


def check_priority(priority: str) -> str:
    """`priority` if it names a priority class, else ValueError naming the accepted ones."""
    if not isinstance(priority, str) or priority not in PRIORITIES:
        accepted = ", ".join(map(repr, PRIORITIES))
        raise ValueError(f"priority must be one of {accepted}, got {priority!r}")
    return priority


def check_reject_retries(reject_retries: int) -> int:
    return _unsigned("reject_retries", reject_retries, _UINT32_MAX)


def _unsigned(name: str, value: int, maximum: int) -> int:
    # Negative or oversized values cannot be encoded as uint32/uint64, so the server never sees them.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise ValueError(f"{name} must be between 0 and {maximum}, got {value}")
    return value


def _disagg_mode(disagg: DisaggMode | str) -> DisaggMode:
    try:
        return DisaggMode(disagg)
    except (ValueError, TypeError):
        accepted = ", ".join(repr(m.value) for m in DisaggMode)
        raise ValueError(f"disagg must be one of {accepted}, got {disagg!r}") from None
