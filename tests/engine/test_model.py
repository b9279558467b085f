"""The paged Llama equals HF transformers' LlamaForCausalLM, prefill and decode, on a written checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvplane.dataplane.engines.reference.kv_pool import KVPool
from kvplane.dataplane.engines.reference.model import LlamaConfig, PagedBatch, PagedLlama
from kvplane.dataplane.engines.reference.weights import load_hf_directory
from kvplane.types import KVLayout

from .helpers import load_hf, write_hf_llama

ATOL = 1e-4
BLOCK_SIZE = 4


def make_pool(model: PagedLlama, num_blocks: int = 32) -> KVPool:
    cfg = model.config
    layout = KVLayout("t", cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, "float32", BLOCK_SIZE)
    return KVPool(layout, num_blocks)


def prompt_ids(vocab_size: int, n: int, seed: int = 0) -> list[int]:
    return torch.randint(3, vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].float()


@pytest.fixture(scope="module")
def paged(hf_dir: Path) -> PagedLlama:
    return load_hf_directory(hf_dir).eval()


def test_full_prefill_logits_match_hf(paged: PagedLlama, hf_model) -> None:  # type: ignore[no-untyped-def]
    ids = prompt_ids(paged.config.vocab_size, 23)
    pool = make_pool(paged)
    block_ids = [7, 2, 11, 0, 5, 9]  # scattered on purpose: the block table must be honoured
    batch = PagedBatch.build([(ids, 0, block_ids)], BLOCK_SIZE)
    ours = paged(batch, pool.buffer)
    assert ours.shape == (23, paged.config.vocab_size)
    torch.testing.assert_close(ours, hf_logits(hf_model, ids), atol=ATOL, rtol=0)


def test_chunked_prefill_then_decode_through_paged_cache_match_hf(paged: PagedLlama, hf_model) -> None:  # type: ignore[no-untyped-def]
    ids = prompt_ids(paged.config.vocab_size, 22, seed=1)
    expected = hf_logits(hf_model, ids)
    pool = make_pool(paged)
    block_ids = [3, 14, 1, 8, 20, 6]
    # Prefill 10 tokens in chunks of 7 and 3, then decode one token at a time.
    steps = [(0, 7), (7, 3)] + [(p, 1) for p in range(10, 22)]
    for start, n in steps:
        batch = PagedBatch.build([(ids[start : start + n], start, block_ids)], BLOCK_SIZE)
        logits = paged(batch, pool.buffer)
        torch.testing.assert_close(logits, expected[start : start + n], atol=ATOL, rtol=0)


def test_mixed_batch_of_prefill_and_decode_matches_hf(paged: PagedLlama, hf_model) -> None:  # type: ignore[no-untyped-def]
    a = prompt_ids(paged.config.vocab_size, 13, seed=2)
    b = prompt_ids(paged.config.vocab_size, 9, seed=3)
    pool = make_pool(paged)
    a_blocks, b_blocks = [0, 1, 2, 3], [10, 11, 12]
    paged(PagedBatch.build([(a[:12], 0, a_blocks)], BLOCK_SIZE), pool.buffer)
    # One step: a decodes its 13th token while b prefills all 9 of its tokens.
    batch = PagedBatch.build([(a[12:], 12, a_blocks), (b, 0, b_blocks)], BLOCK_SIZE)
    last = paged(batch, pool.buffer, batch.last_token_index)
    torch.testing.assert_close(last[0], hf_logits(hf_model, a)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(last[1], hf_logits(hf_model, b)[-1], atol=ATOL, rtol=0)
    assert batch.last_token_index.tolist() == [0, 9]


def test_a_step_of_very_different_contexts_attends_each_over_its_own_blocks(paged: PagedLlama, hf_model) -> None:  # type: ignore[no-untyped-def]
    """A short decode beside a long one and a prefill chunk after a cached prefix: the step runs
    them in groups of similar length (a short sequence does not gather a long one's context),
    each over the blocks it has written, not its whole reservation (blocks still unwritten)."""
    vocab = paged.config.vocab_size
    long, short, chunked = prompt_ids(vocab, 41, seed=4), prompt_ids(vocab, 3, seed=5), prompt_ids(vocab, 18, seed=6)
    pool = make_pool(paged, num_blocks=40)
    long_blocks, short_blocks, chunked_blocks = list(range(0, 14)), [20, 21, 22, 23], [30, 31, 32, 33, 34, 35]
    paged(
        PagedBatch.build([(long[:40], 0, long_blocks), (short[:2], 0, short_blocks), (chunked[:8], 0, chunked_blocks)], BLOCK_SIZE),
        pool.buffer,
    )
    batch = PagedBatch.build([(short[2:], 2, short_blocks), (long[40:], 40, long_blocks), (chunked[8:], 8, chunked_blocks)], BLOCK_SIZE)
    assert len(batch.groups) == 3
    last = paged(batch, pool.buffer, batch.last_token_index)
    for row, ids in enumerate((short, long, chunked)):
        torch.testing.assert_close(last[row], hf_logits(hf_model, ids)[-1], atol=ATOL, rtol=0)


def test_tied_embeddings_checkpoint_matches_hf(tmp_path: Path) -> None:
    directory = write_hf_llama(tmp_path / "tied", tie=True, seed=5)
    assert json.loads((directory / "config.json").read_text())["tie_word_embeddings"] is True
    paged = load_hf_directory(directory).eval()
    assert paged.lm_head.weight.data_ptr() == paged.model.embed_tokens.weight.data_ptr()
    ids = prompt_ids(paged.config.vocab_size, 9, seed=4)
    logits = paged(PagedBatch.build([(ids, 0, [0, 1, 2])], BLOCK_SIZE), make_pool(paged).buffer)
    torch.testing.assert_close(logits, hf_logits(load_hf(directory), ids), atol=ATOL, rtol=0)


def test_sharded_checkpoint_loads_to_the_same_weights(tmp_path: Path, paged: PagedLlama, hf_model) -> None:  # type: ignore[no-untyped-def]
    hf_model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    sharded = load_hf_directory(tmp_path)
    for (name, mine), (_, theirs) in zip(sharded.state_dict().items(), paged.state_dict().items()):
        assert torch.equal(mine, theirs), name


def test_batch_build_rejects_too_few_blocks() -> None:
    with pytest.raises(ValueError, match="needs blocks for 9 positions but has 2 blocks"):
        PagedBatch.build([([1] * 9, 0, [0, 1])], BLOCK_SIZE)
    with pytest.raises(ValueError, match="at least one sequence"):
        PagedBatch.build([], BLOCK_SIZE)


HF_DICT = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 128,
    "eos_token_id": [2, 7],
    "bos_token_id": 1,
}


def test_config_reads_both_rope_spellings_and_derives_head_dim() -> None:
    old = LlamaConfig.from_hf_dict({**HF_DICT, "rope_theta": 500000.0, "rope_scaling": None})
    new = LlamaConfig.from_hf_dict({**HF_DICT, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})
    assert old == new
    assert old.rope_theta == 500000.0
    assert old.head_dim == 8
    assert old.eos_token_ids == (2, 7)


@pytest.mark.parametrize(
    "extra",
    [
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
    ],
)
def test_config_refuses_rope_scaling(extra: dict) -> None:
    with pytest.raises(ValueError, match="implements plain RoPE only \\(rope_scaling must be null\\)"):
        LlamaConfig.from_hf_dict({**HF_DICT, **extra})


def test_config_refuses_other_architectures_and_features() -> None:
    with pytest.raises(ValueError, match="only Llama-family checkpoints.*model_type='gpt2'"):
        LlamaConfig.from_hf_dict({**HF_DICT, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported"):
        LlamaConfig.from_hf_dict({**HF_DICT, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="attention_bias"):
        LlamaConfig.from_hf_dict({**HF_DICT, "attention_bias": True})
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        LlamaConfig.from_hf_dict({**HF_DICT, "num_key_value_heads": 3})


def test_loading_reports_missing_files_and_foreign_weights(tmp_path: Path, hf_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither 'builtin-tiny' nor a local directory"):
        load_hf_directory(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_hf_directory(tmp_path)
    (tmp_path / "config.json").write_text((hf_dir / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="has no \\*.safetensors weights"):
        load_hf_directory(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "shard-1.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="names shard shard-1.safetensors, which is missing"):
        load_hf_directory(tmp_path)
    (tmp_path / "model.safetensors.index.json").unlink()
    from safetensors.torch import save_file

    save_file({"transformer.wte.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="does not hold HF Llama weights: missing \\['lm_head.weight'"):
        load_hf_directory(tmp_path)
