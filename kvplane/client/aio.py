"""The asyncio client: `ClientCore`'s calls run over a grpc.aio channel, waits are asyncio.sleep.

The channel is opened on first use, inside the running event loop that will drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import TypeVar, Unpack

import grpc

from kvplane import grpc_util
from kvplane.call_stream import CallStream
from kvplane.client import calls
from kvplane.client.core import ClientCore
from kvplane.client.from_proto import StreamAssembler
from kvplane.client.lookaside import REPORT_TIMEOUT_S, LookasideRun
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
from kvplane.errors import KvplaneError, NotFoundError
from kvplane.v1 import agent_pb2_grpc, client_pb2, client_pb2_grpc

T = TypeVar("T")


class AsyncClient(ClientCore):
    """asyncio client over grpc.aio: the same methods as `Client`, as coroutines (`stream` is an async iterator)."""

    async def generate(
        self, prompt: str | Sequence[int], options: RequestOptions | None = None, *,
        reject_retries: int | None = None, **fields: Unpack[RequestFields],
    ) -> GenerateResult:  # fmt: skip
        """Runs one request to completion and returns all its tokens and metrics."""
        assembler = StreamAssembler()
        async for chunk in self._stream(self._generate_call(prompt, options, reject_retries, fields, collected=True)):
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
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=REPORT_TIMEOUT_S)
        for reports in self._report_streams.values():
            reports.end()
        self._report_streams = {}
        channels, self._channels, self._stubs = self._channels, {}, {}
        agents, self._agent_channels, self._agent_stubs = self._agent_channels, {}, {}
        for channel in (*channels.values(), *agents.values()):
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    # -- the I/O loops: the only part that differs from Client ------------------------------------

    def _connect(self) -> None:
        # Not yet: a grpc.aio channel belongs to the event loop that first uses it (see _stub).
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, client_pb2_grpc.KvplaneStub] = {}
        self._agent_channels: dict[str, grpc.aio.Channel] = {}  # lookaside mode: decode agents, opened on first use
        self._agent_stubs: dict[str, agent_pb2_grpc.AgentStub] = {}
        self._pending: set[asyncio.Future] = set()  # background reports in flight
        self._report_streams: dict[str, CallStream] = {}  # lookaside reports, one stream per replica

    def _stub(self, endpoint: str) -> client_pb2_grpc.KvplaneStub:
        stub = self._stubs.get(endpoint)
        if stub is None:
            self._channels[endpoint] = grpc_util.aio_channel(endpoint, self.credentials, traced=False)
            stub = self._stubs[endpoint] = client_pb2_grpc.KvplaneStub(self._channels[endpoint])
        return stub

    async def _unary(self, call: calls.UnaryCall[T]) -> T:
        attempts = self._attempts(call)
        while True:
            try:
                response = await getattr(self._stub(attempts.endpoint), call.method)(
                    call.request, timeout=attempts.timeout(), metadata=call.metadata
                )
            except grpc.RpcError as e:
                wait = attempts.wait_after(e)
            else:
                self._answered(attempts)
                return call.result(response)
            await asyncio.sleep(wait)

    async def _stream(self, call: calls.GenerateCall) -> AsyncIterator[GenerateChunk]:
        if call.lookaside:
            # Closed here, not left to the garbage collector: a caller that stops early gets its
            # cancel reported before aclose() returns, while the client's channel is still open.
            async with contextlib.aclosing(self._lookaside(call)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        progress = self._progress(call)
        try:
            while True:
                attempts = progress.attempts
                responses = self._stub(attempts.endpoint).Generate(
                    progress.request(), timeout=attempts.timeout(), metadata=progress.metadata
                )
                try:
                    async for response in responses:
                        yield progress.chunk(response)
                    self._answered(attempts)
                    return
                except grpc.RpcError as e:
                    if progress.finished:  # the answer is whole; only the call's closing status was lost
                        self._answered(attempts)
                        return
                    wait = progress.wait_after(e)
                finally:
                    responses.cancel()  # a no-op after completion; frees the workers when the caller stops early
                await asyncio.sleep(wait)
        finally:
            progress.end()

    async def _lookaside(self, call: calls.GenerateCall) -> AsyncIterator[GenerateChunk]:
        """Lookaside mode (kvplane/client/lookaside.py): place, stream from the agent, report."""
        run = self._lookaside_run(call)
        error: BaseException | None = None
        try:
            agent_request = run.placed((await self._unary(run.route_call(call.reject_retries))).placement)
            while agent_request is not None:
                stream = self._agent_stub(run.placement.endpoint).Generate(
                    agent_request, timeout=run.attempts.timeout(), metadata=run.metadata
                )
                try:
                    while True:
                        try:
                            response = await asyncio.wait_for(stream.read(), run.read_timeout())
                        except TimeoutError:
                            failure = ("", "no progress within the placement's timeout", True)
                            break
                        except grpc.RpcError as e:
                            failure = (e.code().name, e.details() or "", False)
                            break
                        if response is grpc.aio.EOF:
                            failure = ("UNKNOWN", "the agent's stream ended before the request finished", False)
                            break
                        chunk, report = run.chunk(response)
                        if report is not None:
                            self._background(self._report(report))
                        if chunk is None:
                            continue  # news for the control plane (the report above)
                        if response.finished:
                            await self._finished(run, response)
                        yield chunk
                        if response.finished:
                            return
                finally:
                    stream.cancel()
                if run.timed_out_by_caller():
                    raise run.deadline_error()
                agent_request = await self._moved(run, call, failure)
            yield run.end_chunk()
        except Exception as e:
            error = e
            raise
        finally:
            report = run.cancelled_report()
            if report is not None:
                try:
                    await self._report(report)
                except grpc.RpcError:
                    pass  # the replica is gone, and with it the charge; its placement expires otherwise
            run.end(error)

    async def _finished(self, run: LookasideRun, response) -> None:
        report = run.finished_report(response)
        try:
            await self._report(report)
        except grpc.RpcError:  # the stream broke: the call, with its retries, releases the worker
            try:
                await self._unary(run.report_call(report))
            except KvplaneError:
                pass  # the request completed; a replica that forgot it holds no charge for it

    async def _report(self, report: client_pb2.ReportRequest) -> None:
        """A FIRST_TOKEN, FINISHED or CANCELLED report on the preferred replica's report stream.
        Its answer is not read: a replica that forgot the placement (NOT_FOUND) holds no charge
        for it. Raises grpc.RpcError when the stream fails."""
        endpoint = self.endpoints[self._preferred]
        reports = self._report_streams.get(endpoint)
        if reports is None:
            stub = self._stub(endpoint)

            def unary(request: client_pb2.ReportRequest, timeout_s: float):  # a control plane without ReportStream
                metadata = (("traceparent", request.traceparent),) if request.traceparent else None
                return stub.Report(request, timeout=timeout_s, metadata=metadata)

            reports = self._report_streams[endpoint] = CallStream("lookaside report", stub.ReportStream, unary, lambda: REPORT_TIMEOUT_S)
        await reports.call(report)

    async def _moved(self, run: LookasideRun, call: calls.GenerateCall, failure: tuple[str, str, bool]):
        """Reports a failed attempt; the next placement's agent request (None: nothing left to run)."""
        try:
            return run.moved(await self._unary(run.report_call(run.failed_report(*failure))))
        except NotFoundError:
            if not run.can_route_again():
                raise
            return run.placed((await self._unary(run.route_call(call.reject_retries))).placement)

    def _background(self, call) -> None:
        """Sends a report without waiting for it; its answer (or failure) does not matter."""
        task = asyncio.ensure_future(call)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _agent_stub(self, endpoint: str) -> agent_pb2_grpc.AgentStub:
        stub = self._agent_stubs.get(endpoint)
        if stub is None:
            channel = self._agent_channels[endpoint] = grpc_util.aio_channel(endpoint, self.credentials, traced=False)
            stub = self._agent_stubs[endpoint] = agent_pb2_grpc.AgentStub(channel)
        return stub
