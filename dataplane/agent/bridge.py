"""Bridges the engine's thread to asyncio, and turns token ids into a stream of text deltas."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from dataplane.engine.request import EngineOutput, EngineRequest, SamplingParams
from kvplane.v1 import common_pb2


def sampling_from_pb(msg: common_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(
        max_tokens=msg.max_tokens,
        temperature=msg.temperature,
        top_p=msg.top_p if msg.top_p > 0 else 1.0,
        top_k=msg.top_k,
        seed=msg.seed if msg.HasField("seed") else None,
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
    )


def submit(engine, request: EngineRequest) -> asyncio.Queue[EngineOutput]:
    """Queues `request` on the engine; its outputs arrive on the returned queue, in order.

    Raises the engine's EngineInputError / EngineCapacityError synchronously.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
    engine.submit(request, lambda out: loop.call_soon_threadsafe(queue.put_nowait, out))
    return queue


class TextStream:
    """Incremental detokenization: emits only text that later tokens cannot change.

    A byte-level or BPE tokenizer can end mid-character; the replacement character is held
    back until the next token completes it (or the stream ends).
    """

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._token_ids: list[int] = []
        self._num_sent_chars = 0

    def push(self, token_ids: Sequence[int], final: bool = False) -> str:
        self._token_ids.extend(token_ids)
        text = self._tokenizer.decode(self._token_ids)
        stable = len(text) if final else len(text.rstrip("\ufffd"))
        delta = text[self._num_sent_chars:stable]
        self._num_sent_chars = max(self._num_sent_chars, stable)
        return delta
