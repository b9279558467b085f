"""What the blocking and the asyncio client share: where they connect, their defaults, and building calls.

`ClientCore` holds no channel: each client opens its own (grpc or grpc.aio) and runs the calls
built here through its own I/O loop. A method's arguments become a call in one place, so both
clients check them identically and before anything is sent.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from kvplane.client import calls
from kvplane.client.lookaside import LookasideRun
from kvplane.client.request import COLLECTED_STREAM_INTERVAL, RequestOptions, check_reject_retries, request_options
from kvplane.client.results import RouteResult
from kvplane.security.credentials import Credentials, resolve_client
from kvplane.telemetry import client_spans

ENDPOINT_ENV = "KVPLANE_ENDPOINT"
DEFAULT_ENDPOINT = "127.0.0.1:50051"


def resolve_endpoint(endpoint: str | None = None) -> str:
    """The explicit endpoint, else $KVPLANE_ENDPOINT, else 127.0.0.1:50051. Either may list
    several control-plane replicas, comma-separated ("a:50051,b:50051")."""
    if endpoint:
        return endpoint
    return os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT


class ClientCore:
    """`timeout` (seconds) bounds every call, a whole generation and its retries included (None: no bound).

    `reject_retries`: how many times generate/stream/route retry a rejection after its
    retry-after hint (default 0: never); each of those calls may override it.
    Generate calls are traced with `tracer_provider` (default: OpenTelemetry's global one).

    `credentials` (kvplane.Credentials): TLS files or a token, or plaintext; by default the client
    looks in $KVPLANE_TLS_CA/_CERT/_KEY, $KVPLANE_TOKEN, $KVPLANE_INSECURE, then in the credentials
    directory `kvplane up` wrote for this endpoint, and else speaks TLS against the system's CAs.
    `token`: a bearer token sent with those credentials (it names the caller, and so its tenant).
    """

    def __init__(
        self, endpoint: str | None = None, *, timeout: float | None = None, reject_retries: int = 0, tracer_provider=None,
        credentials: Credentials | None = None, token: str | None = None,
    ) -> None:  # fmt: skip
        self.endpoint = resolve_endpoint(endpoint)
        self.endpoints = calls.split_endpoints(self.endpoint)  # the replicas, tried in turn (calls.py)
        self._preferred = 0  # the replica that answered last: calls start there
        found = resolve_client(self.endpoint, credentials)
        self.credentials = found.with_token(token) if token else found
        self.timeout = timeout
        self.reject_retries = check_reject_retries(reject_retries)
        self._tracer = client_spans.tracer_for(tracer_provider)
        self._connect()

    def _connect(self) -> None:
        """Opens the channel, for a client that can do so at construction (the asyncio one cannot)."""

    def _generate_call(
        self, prompt: str | Sequence[int], options: RequestOptions | None, reject_retries: int | None,
        fields: Mapping[str, Any], *, collected: bool = False,
    ) -> calls.GenerateCall:  # fmt: skip
        """`collected`: the caller keeps only the whole answer (generate()), so chunks may be larger."""
        checked = request_options(options, fields)
        request = checked.to_proto(prompt)
        if collected and not request.stream_interval:
            request.stream_interval = COLLECTED_STREAM_INTERVAL
        return calls.generate(request, self._retries(reject_retries), checked.lookaside)

    def _route_call(
        self, prompt: str | Sequence[int], options: RequestOptions | None, reject_retries: int | None,
        fields: Mapping[str, Any],
    ) -> calls.UnaryCall[RouteResult]:  # fmt: skip
        request = request_options(options, fields).to_proto(prompt)
        return calls.route(request, self._retries(reject_retries))

    def _attempts(self, call: calls.UnaryCall | calls.GenerateCall) -> calls.Attempts:
        return calls.Attempts(
            self.endpoints, self.timeout, call.reject_retries, first=self._preferred, credentials=self.credentials.describe()
        )

    def _lookaside_run(self, call: calls.GenerateCall) -> LookasideRun:
        return LookasideRun(call, self._attempts(call), self._tracer, max_resumes=max(2, len(self.endpoints)))

    def _progress(self, call: calls.GenerateCall) -> calls.GenerateProgress:
        return calls.GenerateProgress(call, self._attempts(call), self._tracer, max_resumes=max(2, len(self.endpoints)))

    def _answered(self, attempts: calls.Attempts) -> None:
        """The replica `attempts` ended on answered: later calls start there."""
        self._preferred = attempts.index

    def _retries(self, reject_retries: int | None) -> int:
        return self.reject_retries if reject_retries is None else check_reject_retries(reject_retries)
