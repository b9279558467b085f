"""Llama-family decoder over a paged KV pool.

Rule: RMSNorm -> grouped-query attention with rotary embeddings (HF "default" RoPE, half-split
rotation) -> residual -> RMSNorm -> SwiGLU MLP -> residual, then a final RMSNorm and the LM head.
A step's batch is flat: every sequence contributes a run of query tokens at known positions and a
block table. Each layer first writes the new tokens' K,V into their pool slots, then every
sequence attends over the keys its block table names, causally by position. Prefill, chunked
prefill and decode are therefore the same call. Parameter names match HF's LlamaForCausalLM so
checkpoints load with a strict state_dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(slots=True, frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> LlamaConfig:
        """Build from an HF config.json dict; refuses settings this engine does not implement."""
        arch = cfg.get("architectures") or []
        if cfg.get("model_type") != "llama" and "LlamaForCausalLM" not in arch:
            raise ValueError(
                f"only Llama-family checkpoints are supported (model_type 'llama' / LlamaForCausalLM); "
                f"config.json has model_type={cfg.get('model_type')!r}, architectures={arch!r}"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg.get('hidden_act')!r} is not supported; only 'silu'")
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise ValueError("attention_bias / mlp_bias checkpoints are not supported by the reference engine")
        rope_theta = _rope_theta(cfg)
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(int(e) for e in eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _rope_theta(cfg: dict[str, Any]) -> float:
    # transformers < 5 writes rope_theta + rope_scaling; >= 5 writes rope_parameters.
    scaling = cfg.get("rope_scaling")
    params = cfg.get("rope_parameters")
    for source, value in (("rope_scaling", scaling), ("rope_parameters", params)):
        if value is None:
            continue
        rope_type = value.get("rope_type", value.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"{source} with rope_type {rope_type!r} is not supported: the reference engine implements "
                f"plain RoPE only (rope_scaling must be null). Use a checkpoint without RoPE scaling."
            )
    if params is not None and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(cfg.get("rope_theta", 10000.0))


@dataclass(slots=True)
class AttentionGroup:
    """Sequences of one step whose attention runs together: their block tables and query lengths
    are within 2x of each other, so padding them to the group's longest costs at most 2x (one
    padded batch for the whole step would make a short decode gather a long neighbour's context)."""

    token_index: torch.Tensor  # [Tg] long: the group's query tokens in the step's flat layout
    pad_index: torch.Tensor  # [Tg] long: row of each of them in the padded [g * max_q] layout
    block_tables: torch.Tensor  # [g, M] long, padded with block 0 (masked out)
    query_positions: torch.Tensor  # [g, max_q] long, padding rows at position 0


@dataclass(slots=True)
class PagedBatch:
    """One step's flat batch. T = total query tokens, S = sequences."""

    token_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    slot_block_ids: torch.Tensor  # [T] long: pool block receiving each token's K,V
    slot_offsets: torch.Tensor  # [T] long: offset inside that block
    groups: list[AttentionGroup]
    last_token_index: torch.Tensor  # [S] long: flat index of each sequence's last query token

    @property
    def num_seqs(self) -> int:
        return int(self.last_token_index.shape[0])

    @classmethod
    def build(
        cls,
        seqs: Sequence[tuple[Sequence[int], int, Sequence[int]]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> PagedBatch:
        """seqs: (query token ids, position of the first of them, block ids covering all positions)."""
        if not seqs:
            raise ValueError("a batch needs at least one sequence")
        token_ids: list[int] = []
        positions: list[int] = []
        slot_blocks: list[int] = []
        slot_offsets: list[int] = []
        last_index: list[int] = []
        first_token: list[int] = []
        for s, (query, start, block_ids) in enumerate(seqs):
            if not query:
                raise ValueError(f"sequence {s} has no query tokens")
            end = start + len(query)
            if (end + block_size - 1) // block_size > len(block_ids):
                raise ValueError(f"sequence {s} needs blocks for {end} positions but has {len(block_ids)} blocks")
            first_token.append(len(token_ids))
            for i, tok in enumerate(query):
                pos = start + i
                token_ids.append(int(tok))
                positions.append(pos)
                slot_blocks.append(int(block_ids[pos // block_size]))
                slot_offsets.append(pos % block_size)
            last_index.append(len(token_ids) - 1)

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        # A sequence attends over the blocks up to its last query token (a table may hold more).
        needed = [(start + len(query) + block_size - 1) // block_size for query, start, _ in seqs]
        buckets: dict[tuple[int, int], list[int]] = {}
        for s, (query, _, _) in enumerate(seqs):
            buckets.setdefault(((needed[s] - 1).bit_length(), (len(query) - 1).bit_length()), []).append(s)
        groups = []
        for members in buckets.values():
            max_q = max(len(seqs[s][0]) for s in members)
            max_blocks = max(needed[s] for s in members)
            tables = torch.zeros((len(members), max_blocks), dtype=torch.long)
            qpos = torch.zeros((len(members), max_q), dtype=torch.long)
            token_index: list[int] = []
            pad_index: list[int] = []
            for g, s in enumerate(members):
                query, start, block_ids = seqs[s]
                token_index.extend(range(first_token[s], first_token[s] + len(query)))
                pad_index.extend(range(g * max_q, g * max_q + len(query)))
                tables[g, : needed[s]] = torch.tensor(list(block_ids[: needed[s]]), dtype=torch.long)
                qpos[g, : len(query)] = torch.arange(start, start + len(query))
            groups.append(AttentionGroup(t(token_index), t(pad_index), tables.to(device), qpos.to(device)))
        return cls(
            token_ids=t(token_ids),
            positions=t(positions),
            slot_block_ids=t(slot_blocks),
            slot_offsets=t(slot_offsets),
            groups=groups,
            last_token_index=t(last_index),
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 like HF, so half-precision pools still agree closely.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        # A plain attribute, not a buffer: model.to(float16) must not round the frequencies.
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: PagedBatch,
        kv_buffer: torch.Tensor,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        layer = self.layer_index
        kv_buffer[batch.slot_block_ids, layer, 0, batch.slot_offsets] = k.to(kv_buffer.dtype)
        kv_buffer[batch.slot_block_ids, layer, 1, batch.slot_offsets] = v.to(kv_buffer.dtype)

        if len(batch.groups) == 1 and batch.groups[0].token_index.shape[0] == num_tokens:
            return self.o_proj(self._attend(q, batch.groups[0], kv_buffer))
        out = q.new_empty((num_tokens, self.num_heads * self.head_dim))
        for group in batch.groups:
            out[group.token_index] = self._attend(q[group.token_index], group, kv_buffer)
        return self.o_proj(out)

    def _attend(self, q: torch.Tensor, group: AttentionGroup, kv_buffer: torch.Tensor) -> torch.Tensor:
        """Attention of one group's query tokens [Tg, H, D] over their sequences' KV: [Tg, H * D]."""
        num_seqs, max_q = group.query_positions.shape
        layer = self.layer_index
        # Each sequence's keys through its block table: [g, M, bs, Hkv, D] -> [g, Hkv, M * bs, D].
        keys = kv_buffer[group.block_tables, layer, 0].flatten(1, 2).transpose(1, 2).to(q.dtype)
        values = kv_buffer[group.block_tables, layer, 1].flatten(1, 2).transpose(1, 2).to(q.dtype)
        padded_q = q.new_zeros((num_seqs * max_q, self.num_heads, self.head_dim))
        padded_q[group.pad_index] = q
        padded_q = padded_q.view(num_seqs, max_q, self.num_heads, self.head_dim).transpose(1, 2)
        key_positions = torch.arange(keys.shape[2], device=q.device)
        # Causal by absolute position; padding rows sit at position 0 so no row is fully masked.
        mask = key_positions[None, None, None, :] <= group.query_positions[:, None, :, None]
        out = F.scaled_dot_product_attention(padded_q, keys, values, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads)
        return out.transpose(1, 2).reshape(num_seqs * max_q, self.num_heads * self.head_dim)[group.pad_index]


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_index: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_index)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, batch, kv_buffer) -> torch.Tensor:  # type: ignore[no-untyped-def]
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, batch, kv_buffer)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBackbone(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)


class PagedLlama(nn.Module):
    """Llama causal LM whose attention reads and writes a paged pool (see KVPool.buffer)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaBackbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.inference_mode()
    def forward(self, batch: PagedBatch, kv_buffer: torch.Tensor, logits_index: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [n, vocab] (float32) at logits_index (flat token indices; None = every token)."""
        x = self.model.embed_tokens(batch.token_ids)
        cos, sin = self.model.rotary_emb(batch.positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, batch, kv_buffer)
        if logits_index is not None:
            x = x[logits_index]
        return self.lm_head(self.model.norm(x)).float()
