"""The control plane's tokenizer (controlplane/tokenizer.py): which tokenizer a model's prompts get,
and what it makes of text and chat. No processes; a real tokenizer.json where one is needed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kvplane.chat import ChatTemplateError
from kvplane.controlplane.tokenizer import ANY_MODEL, BYTE, PromptTokenizer, TokenizerError, load, parse_specs
from kvplane.v1 import common_pb2

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


def _info(worker_id: str, model: str = "m", tokenizer: str = "byte") -> common_pb2.WorkerInfo:
    return common_pb2.WorkerInfo(worker_id=worker_id, model=model, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer.json (every word one id) with a chat template beside it."""
    tokenizers = pytest.importorskip("tokenizers")
    directory = tmp_path_factory.mktemp("model")
    vocab = {"[UNK]": 0, "pay": 1, "100": 2, "EUR": 3, "<user>": 4, "<assistant>": 5, "hi": 6}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"<[a-z]+>"), behavior="isolated")
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([tokenizers.pre_tokenizers.WhitespaceSplit(), split])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return directory


def test_specs_name_a_model_or_every_model():
    assert parse_specs(["/models/a", "llama=/models/l", "org/name=/x"]) == {ANY_MODEL: "/models/a", "llama": "/models/l", "org/name": "/x"}
    with pytest.raises(TokenizerError, match="twice"):
        parse_specs(["a=/x", "a=/y"])
    with pytest.raises(TokenizerError, match=r"\[MODEL=\]DIR"):
        parse_specs(["a="])


def test_byte_models_need_nothing_and_a_model_without_one_is_refused_naming_the_flag():
    prompts = PromptTokenizer()
    assert prompts.for_model("m", [_info("a"), _info("b"), _info("x", model="other", tokenizer="")]) is BYTE
    assert asyncio.run(prompts.encode_text(BYTE, "pay 100 €")) == list("pay 100 €".encode())
    with pytest.raises(TokenizerError, match=r"its engine uses the model.s own tokenizer.*--tokenizer m=DIR"):
        prompts.for_model("m", [_info("a", tokenizer="")])
    # One worker claiming the byte tokenizer against the others' does not choose it for them.
    with pytest.raises(TokenizerError, match="disagree"):
        prompts.for_model("m", [_info("a", tokenizer=""), _info("evil")])
    with pytest.raises(ChatTemplateError, match="no chat template"):
        asyncio.run(prompts.encode_chat(BYTE, "m", [{"role": "user", "content": "hi"}]))


def test_the_configured_directory_wins_over_what_workers_report(model_dir: Path):
    prompts = PromptTokenizer.from_specs([f"m={model_dir}"])
    chosen = prompts.for_model("m", [_info("evil")])  # a worker's "byte" changes nothing
    assert chosen.source == str(model_dir)
    assert asyncio.run(prompts.encode_text(chosen, "pay 100 EUR")) == [1, 2, 3]
    chat = asyncio.run(prompts.encode_chat(chosen, "m", [{"role": "user", "content": "hi"}]))
    assert chat == [4, 6, 5]  # rendered by the template, then tokenized
    # A bare directory serves every model without its own.
    assert PromptTokenizer.from_specs([str(model_dir)]).for_model("other", []).source == str(model_dir)


def test_an_unreadable_directory_fails_at_start(tmp_path: Path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        load(tmp_path)
