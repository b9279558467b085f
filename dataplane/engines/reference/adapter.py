"""ReferenceAdapter: the reference engine behind the engine interface (dataplane/engines/base.py).

The reference Engine runs in-process on a step thread and hands each request's outputs to a
callback; generate() turns that callback into an asyncio stream on the caller's loop. It offers
every capability: KV import/export and step profiling are the Engine's own methods, so those
capability objects are the Engine itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from kvplane.dataplane.engines.base import EngineInfo, StepProfiling
from kvplane.dataplane.engines.paged.adapter import PagedEngineAdapter, outputs_until_finished
from kvplane.dataplane.engines.reference.config import EngineConfig
from kvplane.dataplane.engines.reference.engine import Engine
from kvplane.dataplane.engines.request import EngineInputError, EngineOutput, EngineRequest
from kvplane.tokenizer import BYTE_TOKENIZER, ByteTokenizer


def device_name(device: str) -> str:
    """EngineInfo.hardware for a torch device: the GPU's name, or the CPU's model and the threads
    torch computes with (what a CPU step's time depends on)."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "unknown")
    return f"cpu {cpu} ({torch.get_num_threads()} threads)"


def _cpuinfo() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return f.readlines()
    except OSError:
        return []


class ReferenceAdapter(PagedEngineAdapter):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine  # public for benchmarks and tests that drive the engine directly
        config = engine.config
        self._info = EngineInfo(
            model=engine.model_name,
            layout=engine.layout,
            max_context=engine.max_context,
            vocab_size=engine.vocab_size,
            max_tokens_limit=config.max_tokens_limit,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            tokenizer=BYTE_TOKENIZER if isinstance(engine.tokenizer, ByteTokenizer) else "",
            hardware=device_name(config.device),
        )

    @classmethod
    def from_config(cls, config: EngineConfig) -> ReferenceAdapter:
        """Loads the model (slow: seconds for a real checkpoint)."""
        return cls(Engine(config))

    @property
    def info(self) -> EngineInfo:
        return self._info

    async def start(self) -> None:
        self.engine.start()

    async def stop(self) -> None:
        # stop() joins the step thread: keep the loop free meanwhile for the abort outputs it emits.
        await asyncio.to_thread(self.engine.stop)

    def health(self) -> str | None:
        return self.engine.health()

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if request.native_handoff:
            raise EngineInputError("the reference engine has no engine-native KV transfer; it imports KV through kvplane's transports")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
        # Raises EngineInputError / EngineCapacityError here, before the stream exists.
        self.engine.submit(request, lambda out: loop.call_soon_threadsafe(queue.put_nowait, out))
        return outputs_until_finished(queue)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.engine.tokenizer.decode(token_ids)

    @property
    def profiling(self) -> StepProfiling:
        return self.engine
