"""The vLLM engine's entry in the engine registry: `kvplane agent --engine vllm`.

Imports nothing heavy: the adapter (httpx, pyzmq, msgpack: the [engines] extra) only when chosen.
"""

from __future__ import annotations

import argparse

from kvplane.dataplane.engines.base import EngineAdapter
from kvplane.dataplane.engines.external.config import add_shared_arguments, shared_from_args
from kvplane.dataplane.engines.vllm.config import KV_CONNECTORS, VllmConfig

NAME = "vllm"
SUMMARY = "sidecar of a vLLM OpenAI-compatible server (HTTP, token ids in and out; ZMQ KV events; load from /metrics)"
CONFIG_TYPE = VllmConfig
OPTIONAL_DEPENDENCIES = ("httpx", "zmq", "msgpack")  # the [engines] extra in pyproject.toml


def add_arguments(group: argparse._ArgumentGroup) -> None:
    add_shared_arguments(group)
    group.add_argument("--vllm-kv-connector", choices=KV_CONNECTORS, default=VllmConfig().kv_connector,
                       help="the KV connector the vLLM server runs (--kv-transfer-config): nixl = disaggregate through "
                       "NixlConnector with other vLLM workers (default %(default)s)")  # fmt: skip


def config_from_args(args: argparse.Namespace) -> VllmConfig:
    return VllmConfig(**shared_from_args(args), kv_connector=args.vllm_kv_connector).validate()


def create(config: VllmConfig) -> EngineAdapter:
    try:
        from kvplane.dataplane.engines.vllm.adapter import VllmAdapter  # noqa: PLC0415 (only when chosen)
    except ModuleNotFoundError as e:
        if e.name not in OPTIONAL_DEPENDENCIES:
            raise
        raise RuntimeError(f"the vllm engine adapter needs {e.name}: pip install 'kvplane[engines]'") from None
    return VllmAdapter(config)
