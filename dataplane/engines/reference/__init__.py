"""The reference engine: a torch Llama over a paged KV pool with a prefix cache and continuous batching.

Importing this package costs no torch: `kvplane agent` imports the engine's plugin (its flags and
config) whichever engine it runs. The public names below load their modules, and torch, on first
use (PEP 562). The agent reaches the engine through ReferenceAdapter (dataplane/engines/base.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ByteTokenizer": "kvplane.tokenizer",
    "Engine": "kvplane.dataplane.engines.reference.engine",
    "EngineConfig": "kvplane.dataplane.engines.reference.config",
    "HFTokenizer": "kvplane.tokenizer",
    "KVPool": "kvplane.dataplane.engines.reference.kv_pool",
    "ReferenceAdapter": "kvplane.dataplane.engines.reference.adapter",
    "TierStore": "kvplane.dataplane.engines.reference.tiers",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from kvplane.dataplane.engines.reference.adapter import ReferenceAdapter
    from kvplane.dataplane.engines.reference.config import EngineConfig
    from kvplane.dataplane.engines.reference.engine import Engine
    from kvplane.dataplane.engines.reference.kv_pool import KVPool
    from kvplane.dataplane.engines.reference.tiers import TierStore
    from kvplane.tokenizer import ByteTokenizer, HFTokenizer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
