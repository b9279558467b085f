"""The asyncio client: `ClientCore`'s calls run over a grpc.aio channel, waits are asyncio.sleep.

The channel is opened on first use, inside the running event loop that will drive it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import TypeVar, Unpack

import grpc

from kvplane import grpc_util
from kvplane.client import calls
from kvplane.client.core import ClientCore
from kvplane.client.from_proto import StreamAssembler
from kvplane.client.request import RequestFields, RequestOptions
from kvplane.client.results import (
    ClusterStats,
    DrainResult,
    GenerateChunk,
    GenerateResult,
    ProfileResult,
    RouteResult,
    WorkerCache,
    WorkerStatus,
)
from kvplane.v1 import client_pb2_grpc

T = TypeVar("T")


class AsyncClient(ClientCore):
    """asyncio client over grpc.aio: the same methods as `Client`, as coroutines (`stream` is an async iterator)."""

    async def generate(
        self, prompt: str | Sequence[int], options: RequestOptions | None = None, *,
        reject_retries: int | None = None, **fields: Unpack[RequestFields],
    ) -> GenerateResult:  # fmt: skip
        """Runs one request to completion and returns all its tokens and metrics."""
        assembler = StreamAssembler()
        async for chunk in self._stream(self._generate_call(prompt, options, reject_retries, fields)):
            assembler.add(chunk)
        return assembler.result()

    def stream(
        self, prompt: str | Sequence[int], options: RequestOptions | None = None, *,
        reject_retries: int | None = None, **fields: Unpack[RequestFields],
    ) -> AsyncIterator[GenerateChunk]:  # fmt: skip
        """`async for chunk in client.stream(...)`; arguments are checked at the call."""
        return self._stream(self._generate_call(prompt, options, reject_retries, fields))

    async def route(
        self, prompt: str | Sequence[int], options: RequestOptions | None = None, *,
        reject_retries: int | None = None, **fields: Unpack[RequestFields],
    ) -> RouteResult:  # fmt: skip
        """The routing decision for this request, without running it."""
        return await self._unary(self._route_call(prompt, options, reject_retries, fields))

    async def workers(self) -> list[WorkerStatus]:
        """Every registered worker with its role, state and last reported load."""
        return await self._unary(calls.workers())

    async def cache(self) -> list[WorkerCache]:
        """Cached KV blocks per worker and tier, as the cache index holds them."""
        return await self._unary(calls.cache())

    async def stats(self, window_s: float = 0.0) -> ClusterStats:
        """Per-worker TTFT/ITL percentiles, cache hits and KV bytes of recent requests (0 = whole window)."""
        return await self._unary(calls.stats(window_s))

    async def drain(self, worker_id: str) -> DrainResult:
        """Stops new requests going to `worker_id`; running ones finish."""
        return await self._unary(calls.drain(worker_id))

    async def undrain(self, worker_id: str) -> DrainResult:
        """Returns a drained worker to routing."""
        return await self._unary(calls.undrain(worker_id))

    async def config(self) -> dict[str, str]:
        """Every configuration key set in the cluster's store (admission policy, objectives, ...)."""
        return await self._unary(calls.config())

    async def set_config(self, key: str, value: str) -> dict[str, str]:
        """Sets one key (an empty value restores its default); returns the whole resulting config."""
        return await self._unary(calls.set_config(key, value))

    async def profile(self, worker_id: str, *, max_prompt_tokens: int = 0, max_batch: int = 0) -> ProfileResult:
        """Measures a worker's latency profile (0 = the server's default bounds) and stores it."""
        return await self._unary(calls.profile(worker_id, max_prompt_tokens, max_batch))

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub_instance = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    # -- the I/O loops: the only part that differs from Client ------------------------------------

    def _connect(self) -> None:
        # Not yet: a grpc.aio channel belongs to the event loop that first uses it (see _stub).
        self._channel: grpc.aio.Channel | None = None
        self._stub_instance: client_pb2_grpc.KvplaneStub | None = None

    def _stub(self) -> client_pb2_grpc.KvplaneStub:
        if self._stub_instance is None:
            self._channel = grpc_util.aio_channel(self.endpoint, self.credentials, traced=False)
            self._stub_instance = client_pb2_grpc.KvplaneStub(self._channel)
        return self._stub_instance

    async def _unary(self, call: calls.UnaryCall[T]) -> T:
        attempts = self._attempts(call)
        method = getattr(self._stub(), call.method)
        while True:
            try:
                response = await method(call.request, timeout=attempts.timeout())
            except grpc.RpcError as e:
                wait = attempts.wait_after(e)
            else:
                return call.result(response)
            await asyncio.sleep(wait)

    async def _stream(self, call: calls.GenerateCall) -> AsyncIterator[GenerateChunk]:
        progress = self._progress(call)
        try:
            while True:
                timeout = progress.attempts.timeout()
                responses = self._stub().Generate(call.request, timeout=timeout, metadata=progress.metadata)
                try:
                    async for response in responses:
                        yield progress.chunk(response)
                    return
                except grpc.RpcError as e:
                    wait = progress.wait_after(e)
                finally:
                    responses.cancel()  # a no-op after completion; frees the workers when the caller stops early
                await asyncio.sleep(wait)
        finally:
            progress.end()
