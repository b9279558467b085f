"""The reference engine's entry in the engine registry: its flags, its config, its factory.

Imports no torch: the factory imports the engine (and torch) only when this engine is chosen.
"""

from __future__ import annotations

import argparse

from kvplane.dataplane.engines.base import EngineAdapter
from kvplane.dataplane.engines.reference.config import SUPPORTED_DTYPES, EngineConfig

NAME = "reference"
SUMMARY = "kvplane's own torch engine, in the agent's process (paged KV, prefix cache, KV tiers)"
CONFIG_TYPE = EngineConfig
OPTIONAL_DEPENDENCIES = ("torch", "safetensors", "tokenizers")  # the [reference] extra in pyproject.toml


def add_arguments(group: argparse._ArgumentGroup) -> None:
    e = EngineConfig()
    group.add_argument(
        "--model", default=e.model, help="'builtin-tiny', 'builtin-wide', or a local Hugging Face Llama directory (default %(default)s)"
    )
    group.add_argument("--block-size", type=int, default=e.block_size, help="tokens per KV block (default %(default)s)")
    group.add_argument("--num-blocks", type=int, default=e.num_blocks, help="KV blocks in the pool (default %(default)s)")
    group.add_argument(
        "--host-blocks",
        type=int,
        default=e.num_host_blocks,
        help="KV blocks in the host-memory tier, a write-through copy of the device pool; 0 = off (default %(default)s)",
    )
    group.add_argument("--disk-dir", default=e.disk_dir, help="directory of the disk KV tier; its blocks survive restarts (default: off)")
    group.add_argument("--disk-blocks", type=int, default=e.num_disk_blocks, help="KV blocks kept in the disk tier (default %(default)s)")
    group.add_argument("--max-num-seqs", type=int, default=e.max_num_seqs, help="largest decode batch (default %(default)s)")
    group.add_argument(
        "--max-tokens-limit", type=int, default=e.max_tokens_limit, help="largest max_tokens a request may ask for (default %(default)s)"
    )
    group.add_argument("--dtype", default=e.dtype, help=f"KV and weight dtype: {', '.join(SUPPORTED_DTYPES)} (default %(default)s)")
    group.add_argument("--device", default=e.device, help="torch device: cpu, cuda, cuda:N (default %(default)s)")
    group.add_argument(
        "--seed",
        type=int,
        default=e.seed,
        help="seed of the built-in model's weights and of requests without their own seed (default %(default)s)",
    )


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        num_host_blocks=args.host_blocks,
        disk_dir=args.disk_dir,
        num_disk_blocks=args.disk_blocks,
        max_num_seqs=args.max_num_seqs,
        max_tokens_limit=args.max_tokens_limit,
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
    ).validate()


def create(config: EngineConfig) -> EngineAdapter:
    try:
        from kvplane.dataplane.engines.reference.adapter import ReferenceAdapter  # noqa: PLC0415 (torch: only when chosen)
    except ModuleNotFoundError as e:
        if e.name not in OPTIONAL_DEPENDENCIES:
            raise
        raise RuntimeError(f"the reference engine needs {e.name}: pip install 'kvplane[reference]'") from None
    return ReferenceAdapter.from_config(config)
