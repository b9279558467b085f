"""Fixtures of the engine tests: a tiny Llama checkpoint, and the engine servers' Pythons.

The checkpoint is written here (transformers save_pretrained, the tokenizer built by
tests/engine/helpers.py; no download): head_dim 32 (vLLM's CPU attention needs >= 32), 512
positions, float32. The engines' virtualenvs come from `make engines-env`; a test that needs one
that is missing fails and says so (it is not skipped: `make test-engines` must run them all).
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIMS = Path(__file__).resolve().parent / "shims"  # the sgl_kernel import shim (see its docstring)
BLOCK_SIZE = 32  # vLLM on CPU needs a multiple of 32; SGLang's page size is set equal
SERVED_MODEL = "tiny"


def engine_python(engine: str) -> str:
    python = REPO_ROOT / f".venv-{engine}" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} does not exist: run `make engines-env` (it creates .venv-vllm and .venv-sglang)")
    return str(python)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.engine.helpers import write_hf_llama

    return write_hf_llama(
        tmp_path_factory.mktemp("engines") / "tiny-llama",
        hidden_size=128,
        intermediate_size=192,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
