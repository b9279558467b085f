"""Lookaside mode, the I/O-free part both clients share: tokens come from the decode agent itself.

`client.generate(prompt, lookaside=True)` (or `stream`) asks the control plane for a placement
(`Route` with `lookaside` set: the same validation, admission and load accounting as Generate),
calls `Agent.Generate` on the placed worker with the agent request and single-use ticket it got,
and reports back (`Kvplane.Report`): the first token (in the background), the end with the
measured TTFT/TPOT and the agent's metrics (before the caller sees the last chunk, so its next
request finds the worker free, as in relay mode), a cancel when the caller stops early, and, for a
request prefilled on another worker, the prefill's end (the agent's message with
`remote_prefill_done`, which the caller does not see; the control plane releases that worker's
share of the request then). The
asyncio client sends those three on one `ReportStream` per replica (a message costs the control
plane a fraction of a call), the end again as a call if the stream fails; the blocking client
makes a call for each.

Failures are handled as in relay mode, by the control plane: when the agent's call fails, or no
first token (next token) comes within the placement's progress timeouts, the client cancels the
call and reports FAILED with every token it has; the answer is where the request continues
(routed again before the first token, migrated after it, continuing after the tokens already
received) or the error relay mode would have ended the call with. A replica that forgot the
placement (restarted, or another replica answered) answers NOT_FOUND, and the request is routed
again with `resume_token_ids` (admitted again) on the next replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from kvplane.client import calls
from kvplane.client.from_proto import metrics_from_proto
from kvplane.client.results import GenerateChunk
from kvplane.errors import KvplaneError
from kvplane.telemetry import client_spans
from kvplane.v1 import agent_pb2, client_pb2

if TYPE_CHECKING:
    from opentelemetry import trace

Event = client_pb2.ReportRequest
REPORT_TIMEOUT_S = 5.0  # a background or farewell report: not worth waiting longer for
# The placement's own fields win over the agent's in the final metrics: the agent knows the run,
# the control plane what it decided.
_PLACEMENT_METRICS = ("route_reason", "priority", "queued_ms", "predicted_ttft_ms", "predicted_tpot_ms", "prompt_tokens", "num_migrations")


class LookasideRun:
    """One lookaside generate call across its placements: what to send, what was received, what to report."""

    __slots__ = ("attempts", "max_resumes", "num_resumes", "_request", "_clock", "_started", "_token_ids", "placement",
                 "_num_received", "_first_token_at", "_last_token_at", "_done", "_request_id", "_span", "metadata",
                 "_last_chunk", "_placed_at")  # fmt: skip

    def __init__(
        self, call: calls.GenerateCall, attempts: calls.Attempts, tracer: trace.Tracer,
        clock: Callable[[], float] = time.monotonic, max_resumes: int = 2,
    ) -> None:  # fmt: skip
        self.attempts = attempts
        # One CLIENT span for the whole call, as in relay mode; its context goes with the Route,
        # the agent call and the reports, so the control plane's and the agent's spans join it.
        self._span, self.metadata = client_spans.start_generate(tracer, attempts.endpoint, call.request)
        self._last_chunk: GenerateChunk | None = None
        self.max_resumes = max_resumes
        self.num_resumes = 0
        self._request = call.request
        self._clock = clock
        self._started = clock()
        self._token_ids: list[int] = []  # every token received, across placements
        self.placement: client_pb2.Placement | None = None
        self._num_received = 0  # tokens from the current placement
        self._first_token_at: float | None = None
        self._last_token_at = 0.0
        self._done = False
        self._request_id = ""
        self._placed_at = self._started

    # -- placing ------------------------------------------------------------------------------

    def route_call(self, reject_retries: int) -> calls.UnaryCall[client_pb2.RouteResponse]:
        """The Route call that places the request (again, after the tokens received so far)."""
        request = client_pb2.GenerateRequest()
        request.CopyFrom(self._request)
        request.lookaside = True
        request.resume_token_ids[:] = self._token_ids
        return calls.place(request, reject_retries, self.metadata)

    def placed(self, placement: client_pb2.Placement) -> agent_pb2.AgentGenerateRequest:
        """Takes a placement; the request to send its agent."""
        if not placement.placement_id or not placement.endpoint:
            raise KvplaneError(grpc.StatusCode.INTERNAL, "the control plane answered a lookaside Route without a placement")
        self.placement = placement
        self._num_received = 0
        self._done = False
        self._placed_at = self._clock()
        agent_request = agent_pb2.AgentGenerateRequest.FromString(placement.agent_request)
        self._request_id = agent_request.request_id
        # Not a field the ticket binds: this client reports the news (chunk) and hides it.
        agent_request.report_prefill_done = agent_request.HasField("prefill_from")
        return agent_request

    def read_timeout(self) -> float | None:
        """How long to wait for the agent's next message: the placement's progress timeout, or
        the call's time left if that is shorter (None: no bound)."""
        p = self.placement
        if self._num_received:
            progress = p.token_timeout_s
        elif p.first_token_timeout_s:  # from the placement on: news without a token is not the first token
            progress = max(p.first_token_timeout_s - (self._clock() - self._placed_at), 1e-3)
        else:
            progress = 0.0
        left = self.attempts.timeout()
        bounds = [t for t in (progress or None, left) if t is not None]
        return min(bounds) if bounds else None

    def timed_out_by_caller(self) -> bool:
        """A read timeout that was the call's own deadline, not the worker's stall."""
        left = self.attempts.timeout()
        return left is not None and left <= 0.0

    # -- receiving ----------------------------------------------------------------------------

    def chunk(self, response: agent_pb2.AgentGenerateResponse) -> tuple[GenerateChunk | None, client_pb2.ReportRequest | None]:
        """The chunk for one agent message (None: news for the control plane alone), and the
        report to send in the background (the first token's, or the remote prefill's end), if any."""
        report = None
        if response.remote_prefill_done:
            report = self._report(Event.PREFILL_DONE)
            if not response.token_ids and not response.finished:
                return None, report
        if response.token_ids:
            now = self._clock()
            if self._num_received == 0:
                report = self._report(Event.FIRST_TOKEN)
            if self._first_token_at is None:
                self._first_token_at = now
            self._last_token_at = now
            self._num_received += len(response.token_ids)
            self._token_ids += response.token_ids
        metrics = None
        if response.finished:
            self._done = True
            merged = response.metrics
            for name in _PLACEMENT_METRICS:
                setattr(merged, name, getattr(self.placement.metrics, name))
            if self._first_token_at is not None:
                merged.ttft_ms = (self._first_token_at - self._started) * 1000
            metrics = metrics_from_proto(merged, self._request_id)
        chunk = GenerateChunk(
            token_ids=tuple(response.token_ids), text=response.text, finished=response.finished,
            finish_reason=response.finish_reason, metrics=metrics, request_id=self._request_id,
        )  # fmt: skip
        self._last_chunk = chunk
        return chunk, report

    def finished_report(self, response: agent_pb2.AgentGenerateResponse) -> client_pb2.ReportRequest:
        report = self._report(Event.FINISHED)
        report.metrics.CopyFrom(response.metrics)
        report.num_tokens = self._num_received
        if self._first_token_at is not None:
            report.ttft_ms = (self._first_token_at - self._started) * 1000
            if self._num_received > 1:
                report.tpot_ms = (self._last_token_at - self._first_token_at) * 1000 / (len(self._token_ids) - 1)
        return report

    def cancelled_report(self) -> client_pb2.ReportRequest | None:
        """The report for a caller that stopped early (None: the request had ended)."""
        if self._done or self.placement is None:
            return None
        self._done = True
        report = self._report(Event.CANCELLED)
        report.num_tokens = self._num_received
        return report

    def failed_report(self, code: str, details: str, stalled: bool) -> client_pb2.ReportRequest:
        self._done = True  # the control plane releases the placement on this report, whatever it answers
        report = self._report(Event.FAILED)
        report.token_ids[:] = self._token_ids
        report.failure_code, report.failure_details, report.stalled = code, details[:500], stalled
        return report

    def moved(self, answer: client_pb2.ReportResponse) -> agent_pb2.AgentGenerateRequest | None:
        """After a FAILED report: the next placement's agent request, or None when the caller
        has every token already (only the end was lost)."""
        if not answer.HasField("next"):
            self._done = True
            return None
        return self.placed(answer.next)

    def end_chunk(self) -> GenerateChunk:
        """The last chunk of a request whose final message was lost after its last token."""
        return GenerateChunk(token_ids=(), text="", finished=True, finish_reason="length", metrics=None, request_id=self._request_id)

    def report_call(self, report: client_pb2.ReportRequest) -> calls.UnaryCall[client_pb2.ReportResponse]:
        return calls.report(report, self.metadata)

    def deadline_error(self) -> KvplaneError:
        return KvplaneError(grpc.StatusCode.DEADLINE_EXCEEDED, f"the request's timeout passed on decode worker {self.placement.worker_id}")

    def can_route_again(self) -> bool:
        """After the placing replica forgot the request: whether to route it once more."""
        if self.num_resumes >= self.max_resumes:
            return False
        self.num_resumes += 1
        return True

    def end(self, error: BaseException | None) -> None:
        """Ends the call's span (`error`: what ended the call early, if anything)."""
        failure = None
        if isinstance(error, grpc.RpcError):
            failure = error
        elif isinstance(error, KvplaneError):
            failure = _Status(error.code)
        client_spans.end_generate(self._span, self._last_chunk, len(self._token_ids), failure)

    def _report(self, event: int) -> client_pb2.ReportRequest:
        # The trace context rides in the report too: on a stream, metadata is the stream's.
        traceparent = next((v for k, v in self.metadata or () if k == "traceparent"), "")
        return client_pb2.ReportRequest(placement_id=self.placement.placement_id, event=event, traceparent=traceparent)


class _Status:
    """A status code in the shape client_spans.end_generate reads from an RpcError."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code
