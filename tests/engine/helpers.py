"""Helpers shared by the engine tests: a tiny HF Llama checkpoint on disk, and request sinks."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvplane.dataplane.engines import EngineOutput, EngineRequest, SamplingParams
from kvplane.dataplane.engines.reference import Engine

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "prefill and decode run on separate workers and move the kv cache",
    "a block of tokens is hashed with its parent so equal hashes mean equal prefixes",
    "hello world, this is a tiny tokenizer for testing the reference engine",
]


def write_tokenizer(directory: Path) -> int:
    """A small byte-level BPE tokenizer.json with <s>, </s>, <pad>; returns its vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return tok.get_vocab_size()


def write_hf_llama(directory: Path, *, tie: bool = False, seed: int = 0, **overrides: object) -> Path:
    """save_pretrained a randomly initialised tiny LlamaForCausalLM (+ tokenizer) into directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = write_tokenizer(directory)
    kwargs: dict[str, object] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        # Wider than the default 0.02 so logits are far from ties and argmax is stable.
        initializer_range=0.25,
    )
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**kwargs))
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def load_hf(directory: Path):  # type: ignore[no-untyped-def]
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(directory, torch_dtype=torch.float32, attn_implementation="eager").eval()


@dataclass(slots=True)
class Collected:
    """Everything one request's sink received."""

    outputs: list[EngineOutput] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def __call__(self, out: EngineOutput) -> None:
        self.outputs.append(out)
        if out.finished:
            self.done.set()

    @property
    def token_ids(self) -> list[int]:
        return [t for o in self.outputs for t in o.new_token_ids]

    @property
    def final(self) -> EngineOutput:
        assert self.done.wait(20), "request did not finish within 20 s"
        return self.outputs[-1]


def submit(engine: Engine, request: EngineRequest) -> Collected:
    sink = Collected()
    engine.submit(request, sink)
    return sink


def generate(engine: Engine, prompt: list[int], max_tokens: int = 8, request_id: str = "r", **sampling: object) -> Collected:
    """Submit one request and wait for it to finish."""
    sink = submit(engine, EngineRequest(request_id, list(prompt), SamplingParams(max_tokens=max_tokens, **sampling)))  # type: ignore[arg-type]
    _ = sink.final
    return sink
