"""kvplane.hardware: the data files, the KV-size arithmetic and the roofline step time."""

from __future__ import annotations

import json

import pytest

from kvplane import hardware
from kvplane.hardware import Roofline, RooflineConfig, profile_timing
from kvplane.hardware.specs import DATA_DIR
from kvplane.latency import prefill_attention


def test_llama_70b_kv_sizes_and_transfer_times_are_the_published_numbers():
    m = hardware.model("llama-3-70b")
    assert m.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    prompt_bytes = m.kv_bytes_per_token * 4096
    assert prompt_bytes == 1_342_177_280
    assert round(prompt_bytes / 1e9, 2) == 1.34  # GB
    assert round(hardware.link("100gbe").transfer_seconds(prompt_bytes) * 1000) == 107
    assert round(hardware.link("400gbe").transfer_seconds(prompt_bytes) * 1000) == 27
    # The layout the engines use says the same.
    assert m.layout(16).block_nbytes == 16 * 327_680


def test_every_entry_cites_its_source_and_names_resolve_case_insensitively():
    for kind in ("gpus", "models", "links"):
        raw = json.loads((DATA_DIR / f"{kind}.json").read_text())
        entries = {k: v for k, v in raw.items() if not k.startswith("_")}
        assert entries, kind
        for key, entry in entries.items():
            assert len(entry["source"]) > 20, f"{kind}/{key} has no source"
    assert {"a100-80g", "h100-sxm", "h200", "b200"} <= set(hardware.names("gpus"))
    assert {"llama-3-8b", "llama-3-70b", "qwen2.5-7b", "qwen2.5-72b"} <= set(hardware.names("models"))
    assert hardware.gpu("H100").key == "h100-sxm"
    assert hardware.gpu("h100").peak_flops == 989e12 and hardware.gpu("h100").hbm_bytes_per_s == 3.35e12
    with pytest.raises(ValueError, match="unknown gpu 'h1000'; known: a100-80g, a100, h100-sxm"):
        hardware.gpu("h1000")


def test_a_zero_byte_transfer_costs_nothing_and_latency_is_added_once():
    link = hardware.link("100gbe")
    assert link.transfer_seconds(0) == 0.0
    assert link.transfer_seconds(12_500_000) == pytest.approx(0.001 + 10e-6)  # 100 Mbit in 1 ms + 10 us


def test_a_decode_step_is_memory_bound_and_matches_the_hand_computation():
    m, gpu = hardware.model("llama-3-8b"), hardware.gpu("h100")
    r = Roofline(gpu, m, tp=1, config=RooflineConfig(step_overhead_s=0.001))
    # One sequence with 1,024 tokens of context: read every weight once and 1,024 tokens of KV.
    weights = 8.03e9 * 2
    kv = 131_072 * (1024 + 0)
    expected = 0.001 + (weights + kv) / (3.35e12 * 0.8)
    assert r.step_seconds(decode_seqs=1, decode_context_tokens=1024) == pytest.approx(expected, rel=1e-12)
    # Batching decodes costs little more: still memory-bound.
    assert r.step_seconds(decode_seqs=8, decode_context_tokens=8192) < 1.1 * r.step_seconds(decode_seqs=1, decode_context_tokens=1024)


def test_a_prefill_step_is_compute_bound_and_tensor_parallelism_splits_it():
    m, gpu = hardware.model("llama-3-70b"), hardware.gpu("h100")
    attention = prefill_attention(4096, 0)
    r4 = Roofline(gpu, m, tp=4, config=RooflineConfig(step_overhead_s=0.0, allreduce_latency_s=0.0))
    flops = 2 * 70.6e9 * 4096 + 4 * 80 * 64 * 128 * attention
    compute = flops / (4 * 989e12 * 0.5)
    comm = 2 * 80 * (2 * 3 / 4 * 4096 * 8192 * 2 / 900e9)
    assert r4.step_seconds(4096, attention) == pytest.approx(compute + comm, rel=1e-12)
    r8 = Roofline(gpu, m, tp=8, config=RooflineConfig(step_overhead_s=0.0, allreduce_latency_s=0.0))
    assert r8.step_seconds(4096, attention) < r4.step_seconds(4096, attention)


def test_kv_capacity_is_what_fits_beside_the_weights_and_too_small_a_gpu_is_refused():
    m, gpu = hardware.model("llama-3-70b"), hardware.gpu("h100")
    r = Roofline(gpu, m, tp=4)
    usable = 4 * 80e9 * 0.9 - 70.6e9 * 2
    assert r.num_kv_blocks(16) == int(usable // (327_680 * 16))
    with pytest.raises(ValueError, match="llama-3-70b has 141 GB of weights; 1 x h100-sxm .* raise the tensor parallelism"):
        Roofline(gpu, m, tp=1)


def test_a_profile_file_gives_its_step_time_model(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"worker_id": "w", "coefficients": [0.002, 1e-5, 1e-9, 1e-4, 1e-7], "num_samples": 40}))
    timing = profile_timing(path)
    assert timing.step_seconds(prefill_tokens=100, prefill_attention=5000, decode_seqs=2, decode_context_tokens=300) == pytest.approx(
        0.002 + 1e-3 + 5e-6 + 2e-4 + 3e-5
    )
    path.write_text(json.dumps({"coefficients": [1, 2]}))
    with pytest.raises(ValueError, match="must hold 5 non-negative coefficients"):
        profile_timing(path)
    with pytest.raises(ValueError, match="kvplane profile WORKER --json"):
        profile_timing(tmp_path / "missing.json")
