"""Token ids to text as they stream: each delta is text that later tokens cannot change.

The one incremental detokenizer, used where an answer's tokens become text: the control plane,
which relays every answer and detokenizes it with the model's tokenizer (controlplane/tokenizer.py),
and an agent, through its engine's detokenize, for a lookaside caller (whose tokens never cross
the control plane) or a model the control plane has no tokenizer for.

Decoding the whole answer again for every message would cost O(n^2) in its length. A stream
decodes a window instead: a few tokens whose text was sent already, kept for context (a
SentencePiece or byte-level decoder's text for a token depends on the tokens before it: a leading
space, a character split across tokens), then the new ones; the delta is what the window's text
gained. Text ending in U+FFFD (a character whose bytes have not all come) is held back until a later
token completes it, or the stream ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 4  # tokens before the window's new ones, decoded again for context
MAX_WINDOW = 16  # a window longer, its text all sent, moves forward to its last CONTEXT_TOKENS


class TextStream:
    """`decode`: token ids -> text with invalid UTF-8 replaced by U+FFFD (kvplane/tokenizer.py's
    tokenizers, EngineAdapter.detokenize). Deltas joined equal the text of the whole answer."""

    __slots__ = ("_decode", "_token_ids", "_start", "_num_sent_chars")

    def __init__(self, decode: Callable[[Sequence[int]], Awaitable[str]]) -> None:
        self._decode = decode
        self._token_ids: list[int] = []
        self._start = 0  # the window's first token
        self._num_sent_chars = 0  # of the window's text

    async def start_after(self, prompt: Sequence[int], generated: Sequence[int] = ()) -> None:
        """Starts after `prompt` and the tokens of the answer the caller has already (a resumed
        request). The prompt's last tokens are decoded as context, as vLLM and SGLang decode: a
        SentencePiece decoder drops the leading space of the first token it decodes, which would
        take the space off the answer's first word."""
        await self.prime([*prompt[-CONTEXT_TOKENS:], *generated])

    async def prime(self, token_ids: Sequence[int]) -> None:
        """Starts after `token_ids` whose stable text the caller already has (a resumed request)."""
        self._token_ids = list(token_ids)
        self._start = max(len(self._token_ids) - MAX_WINDOW, 0)
        self._num_sent_chars = len((await self._decode(self._token_ids[self._start :])).rstrip(REPLACEMENT))

    async def push(self, token_ids: Sequence[int], final: bool = False) -> str:
        ids = self._token_ids
        ids.extend(token_ids)
        text = await self._decode(ids[self._start :])
        stable = len(text) if final else len(text.rstrip(REPLACEMENT))
        delta = text[self._num_sent_chars : stable]
        self._num_sent_chars = max(self._num_sent_chars, stable)
        if len(ids) - self._start > MAX_WINDOW and not final:
            if stable == len(text):  # every character is sent, so every one of a later window is
                self._start = len(ids) - CONTEXT_TOKENS
                self._num_sent_chars = len(await self._decode(ids[self._start :]))
            elif len(ids) - self._start > 2 * MAX_WINDOW:
                # Messages that keep ending mid-character: move on anyway, keeping more context,
                # as prime() does (the held-back tail is a few tokens of one character).
                await self.prime(ids)
        return delta
