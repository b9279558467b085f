"""What the HTTP face decides before a route runs: who calls, and how much they may send.

Rule, for every request that carries a body (POST):
1. Authentication from the headers alone: a bearer token must be one this replica knows; without
   one, only a plaintext replica that allows anonymous callers lets the request through. Else 401.
2. A declared Content-Length over `max_body_bytes`: 413.
3. The body is read with a running count and a deadline: past `max_body_bytes` 413, not whole
   within `timeout_s` 408. So at most `max_body_bytes` (plus one read) is ever held.
An early answer carries `Connection: close` and the rest of the body is never read: uvicorn stops
reading a connection whose app does not ask for more, and closes it after that answer. (Before
this guard, a 300 MiB unauthenticated body was read and parsed whole: the replica grew by GBs and
its event loop stalled for seconds, long enough for worker leases to expire; issue 28.)

Then `parse_body` turns the bytes into a request model with its cost bounded by the body's shape,
not just its size: at most `HTTP_MAX_JSON_VALUES` JSON values (counted on the bytes before
parsing), no NaN/Infinity literals, no nesting deeper than Python's recursion limit; every
failure is a 400 in OpenAI's error shape, never a 500.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from kvplane.controlplane.http.translate import HttpError
from kvplane.security.auth import Authenticator
from kvplane.security.limits import HTTP_MAX_BODY_BYTES, HTTP_MAX_JSON_VALUES
from kvplane.telemetry.metrics import instruments

M = TypeVar("M", bound=BaseModel)

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})  # metric labels: never the raw path
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
# \ud800-\udfff escaped, or as the bytes json.loads lets through ("surrogatepass"): maybe a lone half
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


@dataclass(frozen=True, slots=True)
class BodyLimits:
    max_body_bytes: int = HTTP_MAX_BODY_BYTES
    timeout_s: float = 30.0  # the whole body must arrive within this (a slow sender holds a connection, not the loop)


def http_authentication_error(authenticator: Authenticator | None, authorization: str | None) -> HttpError | None:
    """The 401 for this Authorization header, or None when the caller is known (or may be anonymous)."""
    if authenticator is None:
        return None
    if authorization is None:
        if authenticator.allow_anonymous:
            return None
        return HttpError(
            401, "send Authorization: Bearer TOKEN with a client token of this cluster", "authentication_error", "missing_token",
            {"WWW-Authenticate": "Bearer"},
        )  # fmt: skip
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or authenticator.tokens.lookup(token.strip()) is None:
        return HttpError(
            401, "the bearer token is not known to this server", "authentication_error", "invalid_token", {"WWW-Authenticate": "Bearer"}
        )
    return None


class _TooLarge(Exception):
    pass


class _Gone(Exception):
    pass


class BodyGuard:
    """ASGI middleware: authenticates and reads a bounded body before the app sees the request."""

    def __init__(self, app, authenticator: Authenticator | None, limits: BodyLimits) -> None:
        self.app = app
        self._authenticator = authenticator
        self._limits = limits

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope["headers"]}
        route = scope["path"] if scope["path"] in _ROUTES else "other"
        authorization = headers.get(b"authorization")
        error = http_authentication_error(self._authenticator, None if authorization is None else authorization.decode("latin-1"))
        length = headers.get(b"content-length")
        if error is None and length is not None and (not length.isdigit() or int(length) > self._limits.max_body_bytes):
            error = self._too_large()
        if error is None:
            try:
                body = await asyncio.wait_for(self._read(receive), self._limits.timeout_s)
            except _TooLarge:
                error = self._too_large()
            except TimeoutError:
                error = HttpError(408, f"the request body did not arrive within {self._limits.timeout_s:g} s", code="request_timeout")
            except _Gone:
                return
        if error is not None:
            await _refuse(send, route, error)
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> HttpError:
        return HttpError(413, f"the request body is larger than {self._limits.max_body_bytes} bytes", code="request_too_large")

    async def _read(self, receive) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Gone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._limits.max_body_bytes:
                raise _TooLarge
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


def _replay(body: bytes, receive):
    """A receive that hands the app the body already read, then the connection's own events."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send, route: str, error: HttpError) -> None:
    instruments().kvplane_http_requests.add(1, {"http.route": route, "http.response.status_code": error.status})
    payload = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def count_json_values(body: bytes) -> int:
    """An upper bound on the values in a JSON document (exact outside strings): each value after
    the first in a container follows a comma, and each container opens with a bracket."""
    bound = body.count(b",") + body.count(b"[") + body.count(b"{") + 1
    if bound <= HTTP_MAX_JSON_VALUES:
        return bound
    bare = _STRING.sub(b'""', body)  # commas and brackets inside strings are text, not values
    return bare.count(b",") + bare.count(b"[") + bare.count(b"{") + 1


def parse_body(body: bytes, model: type[M]) -> M:
    """`body` as a `model`; HttpError(400/413) with the reason otherwise."""
    if count_json_values(body) > HTTP_MAX_JSON_VALUES:
        raise HttpError(413, f"the request body holds more than {HTTP_MAX_JSON_VALUES} JSON values", code="request_too_large")
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise HttpError(400, "invalid request body: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise HttpError(400, f"invalid request body: not JSON ({str(e)[:120]})") from None
    if not isinstance(data, dict):
        raise HttpError(400, "invalid request body: expected a JSON object")
    if _SURROGATE.search(body):
        try:  # a pair decodes to one character; a lone half cannot become UTF-8 (protobuf strings are)
            json.dumps(data, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise HttpError(
                400, "invalid request body: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text"
            ) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise HttpError(400, f"invalid request body: {validation_problems(e.errors())}") from None


def validation_problems(errors: list) -> str:
    """pydantic's errors as one short line, the field path first (at most five)."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc'] if p != 'body') or 'body'}: {err['msg']}" for err in errors[:5])
