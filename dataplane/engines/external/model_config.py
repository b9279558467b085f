"""The served model's KV layout and limits, from its Hugging Face `config.json` (pure).

An external engine reports its block size, but not its model's shape; the agent needs the shape
for the worker's KVLayout (KV bytes per token: transfer cost, compatibility checks). The sidecar
shares the engine's model directory (the engine reports its path), or is given one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Hugging Face dtype names -> kvplane's (KVLayout.dtype).
_DTYPES = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16", "bfloat16": "bfloat16"}


@dataclass(frozen=True, slots=True)
class ModelShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # the checkpoint's dtype (what an engine's "auto" KV dtype becomes)
    vocab_size: int
    max_position_embeddings: int


def read_model_shape(path: str | Path) -> ModelShape:
    """`path` is a model directory or its config.json. ValueError naming what is missing."""
    path = Path(path)
    config_file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise ValueError(f"no model config at {config_file}: give the model's directory (shared with the engine)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file} is not JSON: {e}") from None
    text = config.get("text_config") or config  # multimodal configs nest the language model's
    try:
        num_heads = int(text["num_attention_heads"])
        num_layers = int(text["num_hidden_layers"])
        hidden = int(text["hidden_size"])
    except KeyError as e:
        raise ValueError(f"{config_file} has no {e.args[0]!r}: not a decoder config kvplane can read") from None
    dtype = str(text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype") or "float32")
    return ModelShape(
        num_layers=num_layers,
        num_kv_heads=int(text.get("num_key_value_heads") or num_heads),
        head_dim=int(text.get("head_dim") or hidden // num_heads),
        dtype=_DTYPES.get(dtype, dtype),
        vocab_size=int(text.get("vocab_size") or config.get("vocab_size") or 0),
        max_position_embeddings=int(text.get("max_position_embeddings") or 0),
    )


def kv_dtype(engine_kv_dtype: str, shape: ModelShape) -> str:
    """The KV dtype an engine setting stands for ("auto" = the model's)."""
    if engine_kv_dtype in ("", "auto", "None"):
        return shape.dtype
    return _DTYPES.get(engine_kv_dtype, engine_kv_dtype)
