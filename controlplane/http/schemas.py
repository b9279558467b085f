"""Request bodies of the OpenAI-compatible endpoints (pydantic), with kvplane's extra fields.

Fields OpenAI defines that kvplane does not implement are refused with a 400 naming the field
(`unsupported_fields`), not silently ignored; fields clients commonly send at their neutral
value (`n=1`, penalties 0, `logprobs` null) pass. Every number has the range its protobuf field
can hold (a `max_tokens` of 1e30 is a 400, not an overflow), and a prompt's shape is checked by
hand: pydantic's union of four list shapes took 10 s on a 4 MiB list of empty lists.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvplane.security.limits import HTTP_MAX_PROMPTS

MAX_STOP_STRINGS = 4  # OpenAI's own limit
MAX_MESSAGES = 4096  # chat messages in one request
_UINT32 = 2**32 - 1
# OpenAI request fields kvplane does not implement: any value other than empty is a 400 naming them.
_UNSUPPORTED = (
    "logprobs", "top_logprobs", "logit_bias", "echo", "suffix", "tools", "functions", "function_call",
    "parallel_tool_calls", "audio", "modalities", "prediction", "web_search_options",
)  # fmt: skip


class KvplaneFields(BaseModel):
    """kvplane's knobs, sent as extra body fields (`extra_body=` in the openai package)."""

    cache_salt: str = ""
    priority: str = ""  # "interactive" (default) or "batch"
    disagg: Literal["auto", "never", "always"] = "auto"
    request_id: str = ""
    ignore_eos: bool = False


class SamplingFields(KvplaneFields):
    model_config = ConfigDict(extra="allow")  # unknown fields are checked by unsupported_fields()

    model: str = ""
    max_tokens: int | None = Field(default=None, ge=1, le=_UINT32)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=_UINT32)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, ge=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=_UINT32)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    user: str = ""

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
            raise ValueError(f"stop takes up to {MAX_STOP_STRINGS} non-empty strings")
        return value

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.get("include_usage"))

    def unsupported_fields(self) -> list[str]:
        """Fields set to a value kvplane cannot honour."""
        bad = [name for name in _UNSUPPORTED if self._set(name)]
        bad += [name for name in ("frequency_penalty", "presence_penalty") if self._set(name) and self.model_extra.get(name) != 0]
        extra = self.model_extra or {}
        # Structured output and tool calls change what the model must produce: refused, not ignored,
        # unless sent at the value that asks for plain text.
        if extra.get("response_format") not in (None, {"type": "text"}):
            bad.append("response_format")
        if extra.get("tool_choice") not in (None, "none"):
            bad.append("tool_choice")
        if self.n != 1:
            bad.append("n")
        best_of = self.model_extra.get("best_of")
        if best_of not in (None, 1):
            bad.append("best_of")
        return bad

    def _set(self, name: str) -> bool:
        value = (self.model_extra or {}).get(name)
        return value not in (None, False, [], {})


_PROMPT_SHAPES = "a text, a list of texts, a list of token ids or a list of token id lists"


class CompletionRequest(SamplingFields):
    # A text, a list of texts (one choice each), token ids, or a list of token id lists: checked
    # by _prompt_shape (exact JSON types: true is not a token id).
    prompt: Any
    max_tokens: int | None = Field(default=16, ge=1, le=_UINT32)  # OpenAI's default for completions

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        if isinstance(value, str) or (isinstance(value, list) and all(type(x) is int for x in value)):
            return value
        if not isinstance(value, list):
            raise ValueError(f"prompt must be {_PROMPT_SHAPES}")
        if len(value) > HTTP_MAX_PROMPTS:
            raise ValueError(f"at most {HTTP_MAX_PROMPTS} prompts in one request, got {len(value)}")
        if all(type(x) is str for x in value) or all(type(x) is list and all(type(t) is int for t in x) for x in value):
            return value
        raise ValueError(f"prompt must be {_PROMPT_SHAPES}")

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            return []
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class ChatMessage(BaseModel):
    role: str
    # A string, or OpenAI's list of content parts (only text parts can be served).
    content: str | list[dict[str, Any]] | None = ""

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        kinds = {part.get("type") for part in self.content}
        if kinds - {"text"}:
            raise ValueError(f"message content parts of type {sorted(k for k in kinds if k != 'text')} are not supported; send text")
        return "".join(str(part.get("text", "")) for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
