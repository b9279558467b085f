"""The blocking client: `ClientCore`'s calls run over a grpc channel, waits are time.sleep."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
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


class Client(ClientCore):
    """Blocking client over a grpc channel; `ClientCore` describes timeout, reject_retries and tracing."""

    def generate(
        self, prompt: str | Sequence[int], options: RequestOptions | None = None, *,
        reject_retries: int | None = None, **fields: Unpack[RequestFields],
    ) -> GenerateResult:  # fmt: skip
        """Runs one request to completion and returns all its tokens and metrics."""
        assembler = StreamAssembler()
        for chunk in self._stream(self._generate_call(prompt, options, reject_retries, fields)):
            assembler.add(chunk)
        return assembler.result()

    def stream(
        self, prompt: str | Sequence[int], options: RequestOptions | None = None, *,
        reject_retries: int | None = None, **fields: Unpack[RequestFields],
    ) -> Iterator[GenerateChunk]:  # fmt: skip
        """Yields chunks as tokens arrive; the last has finished=True and the metrics.

        Arguments are checked now, not at the first next(); leaving the loop early cancels the request.
        """
        return self._stream(self._generate_call(prompt, options, reject_retries, fields))

    def route(
        self, prompt: str | Sequence[int], options: RequestOptions | None = None, *,
        reject_retries: int | None = None, **fields: Unpack[RequestFields],
    ) -> RouteResult:  # fmt: skip
        """The routing decision for this request, without running it."""
        return self._unary(self._route_call(prompt, options, reject_retries, fields))

    def workers(self) -> list[WorkerStatus]:
        """Every registered worker with its role, state and last reported load."""
        return self._unary(calls.workers())

    def cache(self) -> list[WorkerCache]:
        """Cached KV blocks per worker and tier, as the cache index holds them."""
        return self._unary(calls.cache())

    def stats(self, window_s: float = 0.0) -> ClusterStats:
        """Per-worker TTFT/ITL percentiles, cache hits and KV bytes of recent requests (0 = whole window)."""
        return self._unary(calls.stats(window_s))

    def drain(self, worker_id: str) -> DrainResult:
        """Stops new requests going to `worker_id`; running ones finish."""
        return self._unary(calls.drain(worker_id))

    def undrain(self, worker_id: str) -> DrainResult:
        """Returns a drained worker to routing."""
        return self._unary(calls.undrain(worker_id))

    def config(self) -> dict[str, str]:
        """Every configuration key set in the cluster's store (admission policy, objectives, ...)."""
        return self._unary(calls.config())

    def set_config(self, key: str, value: str) -> dict[str, str]:
        """Sets one key (an empty value restores its default); returns the whole resulting config."""
        return self._unary(calls.set_config(key, value))

    def profile(self, worker_id: str, *, max_prompt_tokens: int = 0, max_batch: int = 0) -> ProfileResult:
        """Measures a worker's latency profile (0 = the server's default bounds) and stores it."""
        return self._unary(calls.profile(worker_id, max_prompt_tokens, max_batch))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- the I/O loops: the only part that differs from AsyncClient --------------------------------

    def _connect(self) -> None:
        self._channel = grpc_util.channel(self.endpoint, self.credentials)
        self._stub = client_pb2_grpc.KvplaneStub(self._channel)

    def _unary(self, call: calls.UnaryCall[T]) -> T:
        attempts = self._attempts(call)
        method = getattr(self._stub, call.method)
        while True:
            try:
                response = method(call.request, timeout=attempts.timeout())
            except grpc.RpcError as e:
                wait = attempts.wait_after(e)
            else:
                return call.result(response)
            time.sleep(wait)

    def _stream(self, call: calls.GenerateCall) -> Iterator[GenerateChunk]:
        progress = self._progress(call)
        try:
            while True:
                timeout = progress.attempts.timeout()
                responses = self._stub.Generate(call.request, timeout=timeout, metadata=progress.metadata)
                try:
                    for response in responses:
                        yield progress.chunk(response)
                    return
                except grpc.RpcError as e:
                    wait = progress.wait_after(e)
                finally:
                    responses.cancel()  # a no-op after completion; frees the workers when the caller stops early
                time.sleep(wait)
        finally:
            progress.end()
