"""Where model weights come from: the builtin tiny model (seeded, no files) or a local HF directory
(config.json + *.safetensors, single file or sharded with model.safetensors.index.json, plus
tokenizer.json)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from kvplane.dataplane.engines.reference.config import BUILTIN_MODEL, BUILTIN_WIDE_MODEL, EngineConfig
from kvplane.dataplane.engines.reference.kv_pool import TORCH_DTYPES
from kvplane.dataplane.engines.reference.model import LlamaConfig, PagedLlama
from kvplane.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

BUILTIN_CONFIG = LlamaConfig(
    vocab_size=ByteTokenizer.vocab_size,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
    bos_token_id=ByteTokenizer.bos_token_id,
    eos_token_ids=(ByteTokenizer.eos_token_id,),
)

# KV-heavy sibling for transfer benchmarks: 32 KiB of KV per token in float32 (a 16-token block
# is 512 KiB), like a small real model, while prefill stays cheap on a CPU.
BUILTIN_WIDE_CONFIG = dataclasses.replace(
    BUILTIN_CONFIG, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=8, head_dim=64,
)  # fmt: skip

BUILTIN_CONFIGS = {BUILTIN_MODEL: BUILTIN_CONFIG, BUILTIN_WIDE_MODEL: BUILTIN_WIDE_CONFIG}


@dataclass(slots=True)
class LoadedModel:
    name: str
    model: PagedLlama
    tokenizer: Tokenizer
    config: LlamaConfig


def load_model(config: EngineConfig) -> LoadedModel:
    dtype = TORCH_DTYPES[config.dtype]
    if config.model in BUILTIN_CONFIGS:
        model = builtin_model(config.seed, BUILTIN_CONFIGS[config.model])
        tokenizer: Tokenizer = ByteTokenizer()
        name = config.model if config.seed == 0 else f"{config.model}-s{config.seed}"
    else:
        directory = Path(config.model)
        model = load_hf_directory(directory)
        cfg = model.config
        tokenizer = HFTokenizer(directory, eos_token_id=cfg.eos_token_ids[0] if cfg.eos_token_ids else None, bos_token_id=cfg.bos_token_id)
        name = directory.resolve().name
    model = model.to(device=config.device, dtype=dtype).eval()
    return LoadedModel(config.served_model_name or name, model, tokenizer, model.config)


def builtin_model(seed: int, cfg: LlamaConfig = BUILTIN_CONFIG) -> PagedLlama:
    """The builtin tiny Llama with weights drawn from torch.Generator(seed).

    Embeddings ~ N(0, 1) and projections ~ N(0, 1/fan_in) keep activations O(1) through the layers,
    and a sharper LM head makes greedy output depend on context instead of repeating one token."""
    gen = torch.Generator().manual_seed(seed)
    model = PagedLlama(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("embed_tokens.weight"):
                param.copy_(torch.randn(param.shape, generator=gen))
            else:
                scale = 1.0 / math.sqrt(param.shape[1])
                if name == "lm_head.weight":
                    scale *= 4.0
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    return model


def load_hf_directory(directory: Path) -> PagedLlama:
    if not directory.is_dir():
        raise FileNotFoundError(f"model {str(directory)!r} is neither 'builtin-tiny' nor a local directory")
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{directory} has no config.json; expected an HF-style model directory")
    cfg = LlamaConfig.from_hf_dict(json.loads(cfg_path.read_text()))
    state = _load_safetensors(directory)
    # Old checkpoints carry the rotary table; it is recomputed from rope_theta.
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model = PagedLlama(cfg)
    expected = {k for k in model.state_dict() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    missing = sorted(expected - state.keys())
    unexpected = sorted(state.keys() - expected)
    if missing or unexpected:
        raise ValueError(
            f"{directory} does not hold HF Llama weights: missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    model.load_state_dict(state, strict=False)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def _load_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
        for f in files:
            if not (directory / f).is_file():
                raise FileNotFoundError(f"{index} names shard {f}, which is missing from {directory}")
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory} has no *.safetensors weights (pytorch .bin files are not supported)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(directory / f), device="cpu"))
    return state
