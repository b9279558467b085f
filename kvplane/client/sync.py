"""The blocking client: `ClientCore`'s calls run over a grpc channel, waits are time.sleep."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TypeVar, Unpack

import grpc

from kvplane import grpc_util
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
from kvplane.v1 import agent_pb2_grpc, client_pb2_grpc

T = TypeVar("T")


class Client(ClientCore):
    """Blocking client over a grpc channel; `ClientCore` describes timeout, reject_retries and tracing."""

    def generate(
        self, prompt: str | Sequence[int], options: RequestOptions | None = None, *,
        reject_retries: int | None = None, **fields: Unpack[RequestFields],
    ) -> GenerateResult:  # fmt: skip
        """Runs one request to completion and returns all its tokens and metrics."""
        assembler = StreamAssembler()
        for chunk in self._stream(self._generate_call(prompt, options, reject_retries, fields, collected=True)):
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
        deadline = time.monotonic() + REPORT_TIMEOUT_S
        for future in list(self._pending):  # background reports still in flight
            try:
                future.result(timeout=max(deadline - time.monotonic(), 0.0))
            except (grpc.RpcError, grpc.FutureTimeoutError, grpc.FutureCancelledError):
                pass
        for channel in (*self._channels.values(), *self._agent_channels.values()):
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- the I/O loops: the only part that differs from AsyncClient --------------------------------

    def _connect(self) -> None:
        # One channel per replica; grpc connects lazily, so unused ones cost nothing.
        self._channels = {e: grpc_util.channel(e, self.credentials) for e in self.endpoints}
        self._stubs = {e: client_pb2_grpc.KvplaneStub(c) for e, c in self._channels.items()}
        self._agent_channels: dict[str, grpc.Channel] = {}  # lookaside mode: decode agents, opened on first use
        self._agent_stubs: dict[str, agent_pb2_grpc.AgentStub] = {}
        # Background reports in flight, held until done: grpc cancels a call whose future is
        # collected, which lost about 4 in 10 first-token reports before they were sent.
        self._pending: set[grpc.Future] = set()

    def _unary(self, call: calls.UnaryCall[T]) -> T:
        attempts = self._attempts(call)
        while True:
            try:
                response = getattr(self._stubs[attempts.endpoint], call.method)(
                    call.request, timeout=attempts.timeout(), metadata=call.metadata
                )
            except grpc.RpcError as e:
                wait = attempts.wait_after(e)
            else:
                self._answered(attempts)
                return call.result(response)
            time.sleep(wait)

    def _stream(self, call: calls.GenerateCall) -> Iterator[GenerateChunk]:
        if call.lookaside:
            yield from self._lookaside(call)
            return
        progress = self._progress(call)
        try:
            while True:
                attempts = progress.attempts
                stub = self._stubs[attempts.endpoint]
                responses = stub.Generate(progress.request(), timeout=attempts.timeout(), metadata=progress.metadata)
                try:
                    for response in responses:
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
                time.sleep(wait)
        finally:
            progress.end()

    def _lookaside(self, call: calls.GenerateCall) -> Iterator[GenerateChunk]:
        """Lookaside mode (kvplane/client/lookaside.py): place, stream from the agent, report."""
        run = self._lookaside_run(call)
        error: BaseException | None = None
        try:
            agent_request = run.placed(self._unary(run.route_call(call.reject_retries)).placement)
            while agent_request is not None:
                stub = self._agent_stub(run.placement.endpoint)
                responses = stub.Generate(agent_request, timeout=run.attempts.timeout(), metadata=run.metadata)
                watchdog = _Watchdog(responses.cancel)
                try:
                    for response in watchdog.iterate(responses, run.read_timeout):
                        chunk, report = run.chunk(response)
                        if report is not None:
                            self._background(
                                self._stubs[self.endpoints[self._preferred]].Report.future(
                                    report, timeout=REPORT_TIMEOUT_S, metadata=run.metadata
                                )
                            )
                        if chunk is None:
                            continue  # news for the control plane (the report above)
                        if response.finished:
                            self._finished(run, response)
                        yield chunk
                        if response.finished:
                            return
                    failure = ("UNKNOWN", "the agent's stream ended before the request finished", False)
                except grpc.RpcError as e:
                    failure = (e.code().name, e.details() or "", watchdog.fired)
                finally:
                    watchdog.stop()
                    responses.cancel()
                if run.timed_out_by_caller():
                    raise run.deadline_error()
                agent_request = self._moved(run, call, failure)
            yield run.end_chunk()
        except Exception as e:
            error = e
            raise
        finally:
            report = run.cancelled_report()
            if report is not None:
                try:
                    self._stubs[self.endpoints[self._preferred]].Report(report, timeout=REPORT_TIMEOUT_S, metadata=run.metadata)
                except grpc.RpcError:
                    pass  # the replica is gone, and with it the charge; its placement expires otherwise
            run.end(error)

    def _background(self, future: grpc.Future) -> None:
        """Keeps a report's call alive until it is answered; its answer (or failure) does not matter."""
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    def _finished(self, run: LookasideRun, response) -> None:
        try:
            self._unary(run.report_call(run.finished_report(response)))
        except KvplaneError:
            pass  # the request completed; a replica that forgot it holds no charge for it

    def _moved(self, run: LookasideRun, call: calls.GenerateCall, failure: tuple[str, str, bool]):
        """Reports a failed attempt; the next placement's agent request (None: nothing left to run)."""
        try:
            return run.moved(self._unary(run.report_call(run.failed_report(*failure))))
        except NotFoundError:
            if not run.can_route_again():
                raise
            return run.placed(self._unary(run.route_call(call.reject_retries)).placement)

    def _agent_stub(self, endpoint: str) -> agent_pb2_grpc.AgentStub:
        stub = self._agent_stubs.get(endpoint)
        if stub is None:
            channel = self._agent_channels[endpoint] = grpc_util.channel(endpoint, self.credentials)
            stub = self._agent_stubs[endpoint] = agent_pb2_grpc.AgentStub(channel)
        return stub


class _Watchdog:
    """Cancels a blocking stream whose next message does not come in time: grpc's blocking
    iterator has no per-message timeout. One thread per stream, re-armed per message."""

    def __init__(self, cancel: Callable[[], object]) -> None:
        self.fired = False
        self._cancel = cancel
        self._deadline: float | None = None
        self._stopped = False
        self._changed = threading.Condition()
        threading.Thread(target=self._watch, daemon=True, name="kvplane-lookaside-watchdog").start()

    def iterate(self, responses, timeout: Callable[[], float | None]):
        """`responses`, each next() bounded by `timeout()` seconds (None: unbounded)."""
        it = iter(responses)
        while True:
            seconds = timeout()
            with self._changed:
                self._deadline = None if seconds is None else time.monotonic() + seconds
                self._changed.notify()
            try:
                yield next(it)
            except StopIteration:
                return

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()

    def _watch(self) -> None:
        with self._changed:
            while not self._stopped:
                if self._deadline is None:
                    self._changed.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left <= 0:
                    self.fired = True
                    self._cancel()
                    return
                self._changed.wait(left)
