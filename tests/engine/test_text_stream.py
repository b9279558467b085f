"""The incremental detokenizer (kvplane/text_stream.py): deltas joined are the whole answer's text,
whatever the pushes, with a window of bounded length, for the tokenizers kvplane decodes with."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from kvplane.text_stream import MAX_WINDOW, REPLACEMENT, TextStream
from kvplane.tokenizer import ByteTokenizer, HFTokenizer

from .helpers import write_tokenizer

WORDS = ["the", "quick", "brown", "fox", "café", "naïve", "日本語", "😀", "-", "\n", "  ", "jumps", "über"]


def _text(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def _stream(decode, ids: Sequence[int], rng: random.Random, primed: int = 0) -> tuple[list[str], list[int]]:
    """Pushes ids[primed:] in random pieces; the deltas and the length of every decoded window."""
    windows: list[int] = []

    async def decoded(token_ids: Sequence[int]) -> str:
        windows.append(len(token_ids))
        return decode(token_ids)

    async def run() -> list[str]:
        stream = TextStream(decoded)
        if primed:
            await stream.prime(ids[:primed])
        deltas, i = [], primed
        while i < len(ids):
            n = rng.randint(1, 7)
            deltas.append(await stream.push(ids[i : i + n], final=i + n >= len(ids)))
            i += n
        return deltas

    return asyncio.run(run()), windows


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    directory = tmp_path_factory.mktemp("tok")
    write_tokenizer(directory)
    return HFTokenizer(directory)


@pytest.fixture(scope="module")
def metaspace(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    """A SentencePiece-style tokenizer (Metaspace: a token's leading space is its own '▁'), whose
    decoder drops the first token's leading space: the case the window's context tokens are for."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=[f"<0x{b:02X}>" for b in range(256)]
    )
    tok.train_from_iterator([_text(random.Random(i), 40) for i in range(50)], trainer)
    path = tmp_path_factory.mktemp("metaspace") / "tokenizer.json"
    tok.save(str(path))
    return HFTokenizer(path)


@pytest.fixture(params=["byte", "hf", "metaspace"])
def tok(request: pytest.FixtureRequest, hf: HFTokenizer, metaspace: HFTokenizer):  # type: ignore[no-untyped-def]
    return {"byte": ByteTokenizer(), "hf": hf, "metaspace": metaspace}[request.param]


def test_deltas_joined_are_the_answers_text(tok) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    for case in range(60):
        ids = tok.encode(_text(rng, rng.randint(1, 120)))
        deltas, windows = _stream(tok.decode, ids, rng)
        assert "".join(deltas) == tok.decode(ids), case
        # Held back until complete: no delta ends in a split character (the text has none).
        assert not any(d.endswith(REPLACEMENT) for d in deltas)
        # Each decode reads a window, never the whole answer again.
        assert max(windows) <= 2 * MAX_WINDOW + 7, case


def test_a_primed_stream_continues_after_the_callers_text(tok) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(11)
    for case in range(40):
        ids = tok.encode(_text(rng, rng.randint(2, 80)))
        primed = rng.randint(1, len(ids) - 1)
        deltas, _ = _stream(tok.decode, ids, rng, primed=primed)
        had = tok.decode(ids[:primed]).rstrip(REPLACEMENT)
        assert had + "".join(deltas) == tok.decode(ids), case


def test_an_answer_after_its_prompt_keeps_its_first_words_leading_space(tok) -> None:  # type: ignore[no-untyped-def]
    """Started after the prompt, the deltas are what the answer adds to the prompt's text: with a
    SentencePiece-style decoder the answer's first word keeps its space (decoded alone, it loses
    it), and a character split between prompt and answer comes whole."""

    async def decoded(token_ids: Sequence[int]) -> str:
        return tok.decode(token_ids)

    async def answer(prompt: list[int], generated: list[int], rest: list[int]) -> str:
        stream = TextStream(decoded)
        await stream.start_after(prompt, generated)
        return "".join([await stream.push([t], final=i == len(rest) - 1) for i, t in enumerate(rest)])

    rng = random.Random(13)
    for case in range(40):
        ids = tok.encode(_text(rng, rng.randint(2, 60)))
        cut = rng.randint(1, len(ids) - 1)
        had = rng.randint(cut, len(ids) - 1)  # the caller has the answer's tokens up to here (resumed)
        text = asyncio.run(answer(ids[:cut], ids[cut:had], ids[had:]))
        assert tok.decode(ids[:had]).rstrip(REPLACEMENT) + text == tok.decode(ids), case


def test_the_metaspace_decoder_drops_a_leading_space_without_context(metaspace: HFTokenizer) -> None:
    # What the test above guards against: the first token decoded alone loses its space.
    ids = metaspace.encode("the quick brown fox")
    assert metaspace.decode(ids[1:]) != metaspace.decode(ids)[len(metaspace.decode(ids[:1])) :]


def test_long_answer_decodes_in_windows() -> None:
    """2,000 tokens one at a time: the work is linear in the answer, not quadratic."""
    tok = ByteTokenizer()
    ids = tok.encode(_text(random.Random(3), 600))[:2000]
    windows: list[int] = []

    async def decoded(token_ids: Sequence[int]) -> str:
        windows.append(len(token_ids))
        return tok.decode(token_ids)

    async def run() -> str:
        stream = TextStream(decoded)
        return "".join([await stream.push([t], final=i == len(ids) - 1) for i, t in enumerate(ids)])

    assert asyncio.run(run()) == tok.decode(ids)
    assert max(windows) <= 2 * MAX_WINDOW + 1
    assert sum(windows) <= len(ids) * MAX_WINDOW  # decoding it all each time: ~1,000 per token


def test_invalid_bytes_and_ids_beyond_the_byte_vocabulary() -> None:
    tok = ByteTokenizer()
    ids = [104, 0xFF, 105, 300, 195, 169, 257, 40000]  # 'h', a stray byte, 'i', <300>, 'é', eos, <40000>
    assert tok.decode(ids) == "h\ufffdi<300>é<40000>"
    for seed in range(20):
        deltas, _ = _stream(tok.decode, ids, random.Random(seed))
        assert "".join(deltas) == tok.decode(ids)


def test_a_stream_cut_mid_character_sends_the_replacement_at_the_end() -> None:
    tok = ByteTokenizer()

    async def decoded(token_ids: Sequence[int]) -> str:
        return tok.decode(token_ids)

    async def run() -> list[str]:
        stream = TextStream(decoded)
        return [await stream.push([104, 195]), await stream.push([], final=True)]

    assert asyncio.run(run()) == ["h", REPLACEMENT]


def test_write_tokenizer_is_byte_level(hf: HFTokenizer, tmp_path: Path) -> None:
    # The window's context matters for tokenizers whose pieces split characters: this one does.
    pieces = hf.encode("😀")
    assert len(pieces) > 1 and hf.decode(pieces[:1]).endswith(REPLACEMENT)
