"""Protocol messages to engine types, and token ids to a stream of text deltas."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from kvplane.dataplane.engines.request import SamplingParams
from kvplane.sampling import effective_temperature
from kvplane.v1 import common_pb2


def sampling_from_pb(msg: common_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(
        max_tokens=msg.max_tokens,
        temperature=effective_temperature(msg.temperature),
        top_p=msg.top_p if msg.top_p > 0 else 1.0,
        top_k=msg.top_k,
        seed=msg.seed if msg.HasField("seed") else None,
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
    )


class TextStream:
    """Incremental detokenization: emits only text that later tokens cannot change.

    A byte-level or BPE tokenizer can end mid-character; the replacement character is held
    back until the next token completes it (or the stream ends).
    """

    def __init__(self, detokenize: Callable[[Sequence[int]], Awaitable[str]]) -> None:
        self._detokenize = detokenize  # EngineAdapter.detokenize
        self._token_ids: list[int] = []
        self._num_sent_chars = 0

    async def prime(self, token_ids: Sequence[int]) -> None:
        """Starts after `token_ids` whose stable text the caller already has (a resumed request)."""
        self._token_ids = list(token_ids)
        self._num_sent_chars = len((await self._detokenize(self._token_ids)).rstrip("\ufffd"))

    async def push(self, token_ids: Sequence[int], final: bool = False) -> str:
        self._token_ids.extend(token_ids)
        text = await self._detokenize(self._token_ids)
        stable = len(text) if final else len(text.rstrip("\ufffd"))
        delta = text[self._num_sent_chars : stable]
        self._num_sent_chars = max(self._num_sent_chars, stable)
        return delta
