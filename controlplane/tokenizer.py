"""The control plane's tokenizer: every text and chat prompt is tokenized here, never on a worker.

Rule: a model's prompts are tokenized with
1. the tokenizer the operator gave for it (`kvplane controlplane --tokenizer MODEL=DIR`, or
   `--tokenizer DIR` for every model without one of its own): DIR's tokenizer.json (the HF
   `tokenizers` package, an optional dependency) and its chat template (kvplane/chat.py);
2. else the builtin byte tokenizer, when every registered worker of the model reports it
   (WorkerInfo.tokenizer == "byte": the builtin models and the sim engine; nothing to install);
3. else none: a text or chat prompt is refused (FAILED_PRECONDITION, naming the flag); token ids
   still work.
Why the operator's files and not the workers': a worker's claim is what issue 28 stopped
trusting. A tokenizer sent by the first worker of a model would let a compromised one choose how
every tenant's prompts are read; the byte tokenizer is the one claim taken, because it has no
files to substitute and workers that disagree about it leave the model with no tokenizer (rule 3).
So no worker sees text: each sees only the token ids of the requests routed to it. Answers are
detokenized here too, as they are relayed (ModelTokenizer.text_stream; the agents send ids only),
except for a lookaside caller, whose tokens never cross the control plane: its decode agent sends
the text, through its engine's tokenizer.

Directories are read once, at start (a missing file or package fails the start, not a request);
encoding runs in a thread, so that a megabyte prompt does not hold the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvplane.chat import ChatTemplate, ChatTemplateError, load_chat_template
from kvplane.text_stream import TextStream
from kvplane.tokenizer import BYTE_TOKENIZER, ByteTokenizer, HFTokenizer, Tokenizer
from kvplane.v1 import common_pb2

ANY_MODEL = ""  # the key of `--tokenizer DIR` (no MODEL=)


class TokenizerError(ValueError):
    """No tokenizer can be had: a bad --tokenizer at start, or a model with none for a prompt."""


@dataclass(frozen=True, slots=True)
class ModelTokenizer:
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    source: str  # where it came from, for messages: a directory or "builtin byte tokenizer"

    def text_stream(self) -> TextStream:
        """An answer's token ids to text as they are relayed. Decoded on the event loop: a stream
        decodes a window of a few tokens per message (kvplane/text_stream.py): microseconds."""
        decode = self.tokenizer.decode

        async def decoded(token_ids: Sequence[int]) -> str:
            return decode(token_ids)

        return TextStream(decoded)


BYTE = ModelTokenizer(ByteTokenizer(), None, "the builtin byte tokenizer")


def parse_specs(specs: Iterable[str]) -> dict[str, str]:
    """`[MODEL=]DIR` flags -> model (ANY_MODEL for a bare DIR) -> directory."""
    out: dict[str, str] = {}
    for spec in specs:
        model, sep, directory = spec.partition("=")
        if not sep or Path(spec).exists():  # a bare directory (whose path may hold '=')
            model, directory = ANY_MODEL, spec
        if not directory:
            raise TokenizerError(f"--tokenizer {spec!r}: give [MODEL=]DIR, DIR holding the model's tokenizer.json")
        if model in out:
            raise TokenizerError(f"--tokenizer names {'the default' if model == ANY_MODEL else repr(model)} twice")
        out[model] = directory
    return out


def load(directory: str | Path) -> ModelTokenizer:
    """The tokenizer and chat template of a model directory (or of a tokenizer.json file)."""
    path = Path(directory)
    try:
        tokenizer = HFTokenizer(path)
    except (FileNotFoundError, ImportError) as e:
        raise TokenizerError(f"--tokenizer {directory}: {e}") from None
    template = load_chat_template(path if path.is_dir() else path.parent)
    return ModelTokenizer(tokenizer, template, str(directory))


class PromptTokenizer:
    """Per-model tokenizers: the configured ones (loaded at construction), else the byte tokenizer
    the model's workers all report."""

    def __init__(self, configured: Mapping[str, ModelTokenizer] | None = None) -> None:
        self._configured = dict(configured or {})

    @classmethod
    def from_specs(cls, specs: Iterable[str]) -> PromptTokenizer:
        return cls({model: load(directory) for model, directory in parse_specs(specs).items()})

    def for_model(self, model: str, workers: Iterable[common_pb2.WorkerInfo]) -> ModelTokenizer:
        """The model's tokenizer (rule in the module docstring); TokenizerError when it has none."""
        configured = self._configured.get(model) or self._configured.get(ANY_MODEL)
        if configured is not None:
            return configured
        reported = {w.tokenizer for w in workers if w.model == model}
        if reported == {BYTE_TOKENIZER}:
            return BYTE
        why = "its workers disagree on the tokenizer" if len(reported) > 1 else "its engine uses the model's own tokenizer"
        raise TokenizerError(
            f"the control plane has no tokenizer for model {model!r} ({why}): start it with --tokenizer {model}=DIR "
            "(DIR: the model's directory with tokenizer.json; needs the `tokenizers` package), or send token ids"
        )

    async def encode_text(self, tokenizer: ModelTokenizer, text: str) -> list[int]:
        return await asyncio.to_thread(tokenizer.tokenizer.encode, text)

    async def encode_chat(self, tokenizer: ModelTokenizer, model: str, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The conversation rendered by the model's chat template, then tokenized (no special tokens
        added: the template writes them). ChatTemplateError when it has none or refuses it."""
        template = tokenizer.chat_template
        if template is None:
            raise ChatTemplateError(
                f"model {model!r} has no chat template ({tokenizer.source} has no chat_template in its "
                "tokenizer_config.json or chat_template.jinja); send a plain prompt instead"
            )
        encode = tokenizer.tokenizer.encode
        return await asyncio.to_thread(lambda: encode(template.render(messages)))
