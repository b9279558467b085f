"""Engines behind one interface: the interface, its data types, and the registry of engines.

One package per engine under this folder: `reference/` (kvplane's own torch engine, in the
agent's process), `vllm/` and `sglang/` (servers of their own; the agent is their sidecar, with
the pieces they share in `external/`). The
agent reaches an engine only through `EngineAdapter` and its optional capabilities (base.py).
Importing this package imports no torch.
"""

from kvplane.dataplane.engines.base import EngineAdapter, EngineInfo, KVImportExport, NativeHandoff, NativeKVTransfer, StepProfiling
from kvplane.dataplane.engines.events import AllCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvplane.dataplane.engines.registry import (
    DEFAULT_ENGINE,
    ENGINE_NAMES,
    EnginePlugin,
    UnknownEngineError,
    check_config,
    create,
    plugin,
    plugins,
)
from kvplane.dataplane.engines.request import (
    EngineCapacityError,
    EngineInputError,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    SamplingParams,
)

__all__ = [
    "AllCleared",
    "BlockRemoved",
    "BlockStored",
    "DEFAULT_ENGINE",
    "ENGINE_NAMES",
    "EngineAdapter",
    "EngineCapacityError",
    "EngineInfo",
    "EngineInputError",
    "EngineLoad",
    "EngineOutput",
    "EnginePlugin",
    "EngineRequest",
    "KVCacheEvent",
    "KVImportExport",
    "NativeHandoff",
    "NativeKVTransfer",
    "SamplingParams",
    "StepProfiling",
    "UnknownEngineError",
    "check_config",
    "create",
    "plugin",
    "plugins",
]
