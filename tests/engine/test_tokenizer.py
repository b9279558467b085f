"""Byte tokenizer and the HF tokenizer wrapper."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplane.tokenizer import ByteTokenizer, HFTokenizer


def test_byte_tokenizer_round_trip_and_specials() -> None:
    tok = ByteTokenizer()
    assert tok.vocab_size == 259 and (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (256, 257, 258)
    assert tok.encode("hé") == [104, 195, 169]
    assert tok.encode("a", add_special_tokens=True) == [256, 97]
    assert tok.decode([256, 104, 195, 169, 257]) == "hé"


def test_byte_tokenizer_decodes_partial_utf8_safely() -> None:
    tok = ByteTokenizer()
    assert tok.decode([104, 195]) == "h\ufffd"  # a stream cut mid-character


def test_hf_tokenizer_wrapper(hf_dir: Path) -> None:
    tok = HFTokenizer(hf_dir)
    assert tok.eos_token_id == 2 and tok.bos_token_id == 1
    assert tok.vocab_size == 320
    ids = tok.encode("the quick brown fox")
    assert ids and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == "the quick brown fox"
    assert tok.decode([tok.bos_token_id, *ids, tok.eos_token_id]) == "the quick brown fox"
    assert tok.encode("the", add_special_tokens=False) == tok.encode("the")
    # Byte-level pieces of a multi-byte character, cut in half, decode without raising.
    pieces = tok.encode("é")
    assert isinstance(tok.decode(pieces[:1]), str)


def test_hf_tokenizer_explicit_special_ids_win(hf_dir: Path) -> None:
    assert HFTokenizer(hf_dir / "tokenizer.json", eos_token_id=7).eos_token_id == 7


def test_hf_tokenizer_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no tokenizer.json at"):
        HFTokenizer(tmp_path)
