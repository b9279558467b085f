"""EngineConfig validation."""

from __future__ import annotations

import pytest

from kvplane.dataplane.engines.reference.config import EngineConfig


def test_defaults_are_valid() -> None:
    cfg = EngineConfig()
    assert cfg.validate() is cfg
    assert (cfg.model, cfg.block_size, cfg.num_blocks, cfg.max_num_seqs) == ("builtin-tiny", 16, 512, 16)
    assert (cfg.max_tokens_limit, cfg.max_num_batched_tokens, cfg.dtype, cfg.device, cfg.seed) == (
        1024,
        2048,
        "float32",
        "cpu",
        0,
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": ""}, "EngineConfig.model is empty"),
        ({"block_size": 0}, "EngineConfig.block_size must be a positive integer, got 0"),
        ({"num_blocks": -1}, "EngineConfig.num_blocks must be a positive integer, got -1"),
        ({"max_num_seqs": 2.5}, "EngineConfig.max_num_seqs must be a positive integer, got 2.5"),
        ({"max_tokens_limit": True}, "EngineConfig.max_tokens_limit must be a positive integer, got True"),
        ({"max_num_batched_tokens": 4, "max_num_seqs": 8}, "must be at least max_num_seqs \\(8\\)"),
        ({"dtype": "int8"}, "EngineConfig.dtype 'int8' is not supported"),
        ({"device": "tpu"}, "EngineConfig.device 'tpu' is not supported"),
        ({"seed": -1}, "EngineConfig.seed must be a non-negative integer"),
    ],
)
def test_validate_names_the_bad_field(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**overrides).validate()


def test_cuda_device_names_are_accepted() -> None:
    assert EngineConfig(device="cuda:1").validate().device == "cuda:1"
