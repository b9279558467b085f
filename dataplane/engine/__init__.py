"""The reference engine: a torch Llama over a paged KV pool with a prefix cache and continuous batching."""
from dataplane.engine.config import EngineConfig
from dataplane.engine.engine import Engine
from dataplane.engine.events import AllCleared, BlockRemoved, BlockStored, KVCacheEvent
from dataplane.engine.kv_pool import KVPool
from dataplane.engine.request import (
    EngineCapacityError,
    EngineInputError,
    EngineLoad,
    EngineOutput,
    EngineRequest,
    SamplingParams,
)
from dataplane.engine.tokenizer import ByteTokenizer, HFTokenizer

__all__ = [
    "AllCleared",
    "BlockRemoved",
    "BlockStored",
    "ByteTokenizer",
    "Engine",
    "EngineCapacityError",
    "EngineConfig",
    "EngineInputError",
    "EngineLoad",
    "EngineOutput",
    "EngineRequest",
    "HFTokenizer",
    "KVCacheEvent",
    "KVPool",
    "SamplingParams",
]
