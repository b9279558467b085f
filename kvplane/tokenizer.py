"""Tokenizers: the byte tokenizer of the builtin models and an HF `tokenizer.json` wrapper.

Shared by the reference engine (which loads a model's) and the control plane (which tokenizes
every prompt itself, controlplane/tokenizer.py, so that no worker sees text not routed to it).
Both decode with invalid UTF-8 replaced (U+FFFD), so decoding a prefix of a stream never raises.
The HF one needs the `tokenizers` package (an optional dependency), imported when one is built.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

# What a worker reports in WorkerInfo.tokenizer when its engine tokenizes with ByteTokenizer.
BYTE_TOKENIZER = "byte"
INSTALL_HINT = "pip install 'kvplane[tokenizers]' (or: pip install tokenizers)"


class Tokenizer(Protocol):
    vocab_size: int
    eos_token_id: int | None
    bos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """Ids 0..255 are the UTF-8 bytes; then bos, eos, pad. The sim engine reports it too, and
    samples its answers from its model's vocabulary: an id beyond this one's decodes as <id>."""

    __slots__ = ()
    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258
    vocab_size = 259

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, token_ids: Sequence[int]) -> str:
        if max(token_ids, default=0) < 256:  # bytes only (most of a byte model's answer): all in C
            return bytes(token_ids).decode("utf-8", errors="replace")
        out, pending = [], bytearray()
        for t in token_ids:
            if t < 256:
                pending.append(t)
            elif t >= self.vocab_size:
                out.append(pending.decode("utf-8", errors="replace"))
                out.append(f"<{t}>")
                pending.clear()
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)


class HFTokenizer:
    """tokenizer.json via the `tokenizers` library; special tokens are skipped when decoding."""

    __slots__ = ("_tok", "vocab_size", "eos_token_id", "bos_token_id")

    def __init__(self, path: str | Path, eos_token_id: int | None = None, bos_token_id: int | None = None) -> None:
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {file}; the model directory needs an HF fast tokenizer file")
        try:
            import tokenizers
        except ImportError:
            raise ImportError(f"reading {file} needs the `tokenizers` package: {INSTALL_HINT}") from None
        self._tok = tokenizers.Tokenizer.from_file(str(file))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        special = _special_tokens(file.parent)
        self.eos_token_id = eos_token_id if eos_token_id is not None else self._id_of(special.get("eos_token"))
        self.bos_token_id = bos_token_id if bos_token_id is not None else self._id_of(special.get("bos_token"))

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=True)


def _special_tokens(directory: Path) -> dict[str, str]:
    """bos/eos token strings from tokenizer_config.json, when present."""
    cfg_path = directory / "tokenizer_config.json"
    if not cfg_path.is_file():
        return {}
    cfg = json.loads(cfg_path.read_text())
    out: dict[str, str] = {}
    for key in ("bos_token", "eos_token"):
        value = cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out
