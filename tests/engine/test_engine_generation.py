"""Engine generation: HF-equal greedy output, prefix-cache reuse, continuous batching, seeded sampling."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kvplane.block_hash import hash_blocks
from kvplane.dataplane.engines import BlockStored, EngineRequest, SamplingParams
from kvplane.dataplane.engines.reference import Engine

from .helpers import generate, submit

BS = 4


def byte_prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_builtin_greedy_output_is_not_degenerate(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    out = generate(engine, engine.tokenizer.encode("Hello, world! this is a test"), max_tokens=32)
    assert len(out.token_ids) == 32
    assert len(set(out.token_ids)) >= 8
    assert engine.model_name == "builtin-tiny" and engine.vocab_size == 259 and engine.max_context == 2048


def test_greedy_generation_equals_hf_generate(make_engine: Callable[..., Engine], hf_dir: Path, hf_model) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(model=str(hf_dir))
    assert engine.model_name == "tiny-llama" and engine.layout.model == "tiny-llama"
    for i, text in enumerate(["the quick brown fox", "hello world, this is", "prefill and decode run on"]):
        prompt = engine.tokenizer.encode(text)
        out = generate(engine, prompt, max_tokens=12, request_id=f"r{i}")
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=2)[
                0, len(prompt) :
            ].tolist()
        assert out.token_ids == ref
        assert out.final.finish_reason == ("eos" if ref[-1] == 2 else "length")


def test_prefix_cache_computes_only_the_uncached_suffix(make_engine: Callable[..., Engine]) -> None:
    cached = make_engine(block_size=BS)
    fresh = make_engine(block_size=BS)
    a = byte_prompt(30, seed=1)
    generate(cached, a, max_tokens=4, request_id="a")
    cached.take_kv_events()
    # b shares a's first 22 tokens: 5 full blocks (20 tokens) hash the same.
    b = a[:22] + byte_prompt(6, seed=2)
    out = generate(cached, b, max_tokens=10, request_id="b")
    assert (out.final.num_prompt_tokens, out.final.num_cached_tokens) == (28, 20)
    assert out.token_ids == generate(fresh, b, max_tokens=10, request_id="b").token_ids
    # Only b's new full blocks are published: prompt blocks 5, 6 and, after decoding, 7..9.
    b_hashes = hash_blocks(b + out.token_ids[:9], BS, cached.model_name)
    stored = [h for e in cached.take_kv_events() if isinstance(e, BlockStored) for h in e.block_hashes]
    assert stored == b_hashes[5:9]


def test_identical_and_block_aligned_prompts_still_compute_one_block(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(block_size=BS)
    fresh = make_engine(block_size=BS)
    a = byte_prompt(32, seed=3)  # exactly 8 blocks
    first = generate(engine, a, max_tokens=5, request_id="a1")
    second = generate(engine, a, max_tokens=5, request_id="a2")
    assert first.final.num_cached_tokens == 0
    assert second.final.num_cached_tokens == 28  # capped at (32 - 1) // 4 = 7 blocks
    assert first.token_ids == second.token_ids == generate(fresh, a, max_tokens=5).token_ids


def test_cache_salt_separates_tenants(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(block_size=BS)
    prompt = byte_prompt(20, seed=4)
    params = SamplingParams(max_tokens=2)
    assert submit(engine, EngineRequest("t1", prompt, params, cache_salt="tenant-1")).final.num_cached_tokens == 0
    assert submit(engine, EngineRequest("t2", prompt, params, cache_salt="tenant-2")).final.num_cached_tokens == 0
    assert submit(engine, EngineRequest("t3", prompt, params, cache_salt="tenant-1")).final.num_cached_tokens == 16


def test_concurrent_requests_match_each_run_alone(make_engine: Callable[..., Engine]) -> None:
    # Few seats and a small token budget force waiting, chunked prefill and mixed batches.
    batched = make_engine(start=False, max_num_seqs=4, max_num_batched_tokens=12, num_blocks=96)
    alone = make_engine(num_blocks=96)
    prompts = [byte_prompt(n, seed=10 + n) for n in (3, 17, 9, 30, 5, 22)]
    max_tokens = [12, 6, 15, 8, 10, 9]
    sinks = [submit(batched, EngineRequest(f"r{i}", p, SamplingParams(max_tokens=m))) for i, (p, m) in enumerate(zip(prompts, max_tokens))]
    assert batched.load().num_waiting == 6
    batched.start()
    for i, (sink, p, m) in enumerate(zip(sinks, prompts, max_tokens)):
        assert sink.final.finish_reason == "length"
        assert sink.token_ids == generate(alone, p, max_tokens=m, request_id=f"r{i}").token_ids
        assert [len(o.new_token_ids) for o in sink.outputs] == [1] * m  # one token per output
    load = batched.load()
    assert (load.num_running, load.num_waiting, load.num_used_blocks, load.num_queued_prefill_tokens) == (0, 0, 0, 0)


def test_seeded_sampling_is_reproducible_regardless_of_batching(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    prompt = byte_prompt(12, seed=5)
    params = dict(temperature=0.9, top_k=40, top_p=0.95, seed=1234)
    alone = generate(engine, prompt, max_tokens=20, request_id="alone", **params).token_ids
    others = [
        submit(engine, EngineRequest(f"o{i}", byte_prompt(8 + i, seed=i), SamplingParams(max_tokens=20, temperature=1.0))) for i in range(3)
    ]
    batched = submit(engine, EngineRequest("batched", prompt, SamplingParams(max_tokens=20, **params)))  # type: ignore[arg-type]
    assert batched.final.finish_reason == "length"
    assert batched.token_ids == alone
    for o in others:
        assert o.final.finish_reason == "length"
    other_seed = generate(engine, prompt, max_tokens=20, request_id="x", **{**params, "seed": 99}).token_ids
    assert other_seed != alone


def test_unseeded_sampling_follows_the_engine_seed(make_engine: Callable[..., Engine]) -> None:
    prompt = byte_prompt(6, seed=6)
    runs = [generate(make_engine(seed=s), prompt, max_tokens=16, temperature=1.0).token_ids for s in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_model_names_and_layout(make_engine: Callable[..., Engine]) -> None:
    assert make_engine(start=False, seed=3).model_name == "builtin-tiny-s3"  # other weights, other name
    named = make_engine(start=False, served_model_name="tiny", block_size=8, dtype="bfloat16")
    assert named.model_name == "tiny"
    assert (named.layout.model, named.layout.num_layers, named.layout.num_kv_heads) == ("tiny", 2, 2)
    assert (named.layout.head_dim, named.layout.dtype, named.layout.block_size) == (16, "bfloat16", 8)
    assert named.pool.layout == named.layout and named.pool.buffer.dtype == torch.bfloat16


def test_half_precision_engine_generates(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(dtype="bfloat16")
    out = generate(engine, byte_prompt(9, seed=8), max_tokens=10)
    assert out.final.finish_reason == "length" and len(out.token_ids) == 10
    assert all(0 <= t < engine.vocab_size for t in out.token_ids)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_engine_matches_cpu_greedy(make_engine: Callable[..., Engine]) -> None:
    prompt = byte_prompt(21, seed=9)
    on_gpu = make_engine(device="cuda")
    assert on_gpu.pool.buffer.is_cuda
    gpu = generate(on_gpu, prompt, max_tokens=16).token_ids
    assert gpu == generate(make_engine(), prompt, max_tokens=16).token_ids
