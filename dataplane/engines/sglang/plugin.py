"""The SGLang engine's entry in the engine registry: `kvplane agent --engine sglang`.

Imports nothing heavy: the adapter (grpc stubs from smg-grpc-proto, pyzmq, msgpack, tokenizers:
the [engines] extra) only when chosen.
"""

from __future__ import annotations

import argparse

from kvplane.dataplane.engines.base import EngineAdapter
from kvplane.dataplane.engines.external.config import add_shared_arguments, shared_from_args
from kvplane.dataplane.engines.sglang.config import SglangConfig

NAME = "sglang"
SUMMARY = "sidecar of an SGLang server (its gRPC scheduler API, --smg-grpc-mode; ZMQ KV events; load from GetLoads)"
CONFIG_TYPE = SglangConfig
OPTIONAL_DEPENDENCIES = ("smg_grpc_proto", "zmq", "msgpack", "tokenizers")  # the [engines] extra


def add_arguments(group: argparse._ArgumentGroup) -> None:
    add_shared_arguments(group)
    group.add_argument("--sglang-bootstrap-host", default=SglangConfig().bootstrap_host, metavar="HOST",
                       help="address decode servers dial for this prefill server's KV bootstrap (default: the engine endpoint's host)")  # fmt: skip


def config_from_args(args: argparse.Namespace) -> SglangConfig:
    return SglangConfig(**shared_from_args(args), bootstrap_host=args.sglang_bootstrap_host).validate()


def create(config: SglangConfig) -> EngineAdapter:
    try:
        from kvplane.dataplane.engines.sglang.adapter import SglangAdapter  # noqa: PLC0415 (only when chosen)
    except ModuleNotFoundError as e:
        if e.name not in OPTIONAL_DEPENDENCIES:
            raise
        raise RuntimeError(f"the sglang engine adapter needs {e.name}: pip install 'kvplane[engines]'") from None
    return SglangAdapter(config)
