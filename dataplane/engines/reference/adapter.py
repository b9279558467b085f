"""ReferenceAdapter: the reference engine behind the engine interface (dataplane/engines/base.py).

The reference Engine runs in-process on a step thread and hands each request's outputs to a
callback; generate() turns that callback into an asyncio stream on the caller's loop. It offers
every capability: KV import/export and step profiling are the Engine's own methods, so those
capability objects are the Engine itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from kvplane.chat import ChatTemplateError, load_chat_template
from kvplane.dataplane.engines.base import EngineInfo, StepProfiling
from kvplane.dataplane.engines.paged.adapter import PagedEngineAdapter, outputs_until_finished
from kvplane.dataplane.engines.reference.config import EngineConfig
from kvplane.dataplane.engines.reference.engine import Engine
from kvplane.dataplane.engines.request import EngineInputError, EngineOutput, EngineRequest
from kvplane.tokenizer import BYTE_TOKENIZER, ByteTokenizer


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
        )
        # A local checkpoint directory may ship a chat template; the builtin models do not.
        self._chat_template = load_chat_template(config.model) if Path(config.model).is_dir() else None

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

    async def tokenize(self, text: str) -> list[int]:
        # In a worker thread: a long prompt must not stall the agent's event loop (KV pulls, other requests).
        return await asyncio.to_thread(self.engine.tokenizer.encode, text)

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.engine.tokenizer.decode(token_ids)

    async def tokenize_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if self._chat_template is None:
            raise ChatTemplateError(
                f"model {self._info.model!r} has no chat template (no chat_template in its tokenizer_config.json "
                "or chat_template.jinja); send a plain prompt instead"
            )
        template, encode = self._chat_template, self.engine.tokenizer.encode
        return await asyncio.to_thread(lambda: encode(template.render(messages)))  # off the loop, as tokenize

    @property
    def profiling(self) -> StepProfiling:
        return self.engine
