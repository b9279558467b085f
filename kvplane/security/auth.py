"""Server-side authentication and authorization: who is calling, and may they call this method.

Authentication, in order: a bearer token in the `authorization` metadata (looked up in the
server's TokenTable; an unknown token is refused, never ignored), else the SPIFFE ID of the
caller's TLS certificate (with mTLS every caller has one), else, on a plaintext server that
allows it, the anonymous client. Authorization is a table from full method name to the roles
that may call it (the shape of Kubernetes RBAC rules); a method the table does not name is
refused (fail closed), except gRPC health checking and reflection, which reveal nothing.

`AuthInterceptor` applies both to every call before the servicer runs, plus a per-identity rate
limit on the methods marked for it, and leaves the caller's identity in `CALLER` for the servicer
(tenant salts, ticket checks). Messages name the caller and the roles needed, never echo input.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from kvplane.errors import rejection_trailers
from kvplane.security.handlers import wrap
from kvplane.security.identity import ANONYMOUS, ANY_WORKER, Identity, IdentityError, Role, identity_from_spiffe_id
from kvplane.security.ratelimit import RateLimiter

log = logging.getLogger(__name__)

CALLER: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("kvplane_caller", default=None)
AUTHORIZATION = "authorization"
_OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class AuthError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class TokenTable:
    """Bearer tokens and the identities they stand for; tokens are kept only as SHA-256 digests."""

    def __init__(self) -> None:
        self._by_digest: dict[bytes, Identity] = {}

    def __len__(self) -> int:
        return len(self._by_digest)

    def add(self, token: str, identity: Identity) -> None:
        if len(token) < 16:
            raise ValueError(f"a token for {identity} is shorter than 16 characters: use a random one (e.g. `openssl rand -hex 24`)")
        self._by_digest[hashlib.sha256(token.encode()).digest()] = identity

    def lookup(self, token: str) -> Identity | None:
        digest = hashlib.sha256(token.encode()).digest()
        for known, identity in self._by_digest.items():  # constant time per entry
            if hmac.compare_digest(known, digest):
                return identity
        return None

    @classmethod
    def from_file(cls, path: str | Path) -> TokenTable:
        """Lines `TOKEN,ROLE,NAME[,TENANT]` (Kubernetes' static token file shape); '#' starts a comment."""
        table = cls()
        for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            fields = [f.strip() for f in line.split(",")]
            try:
                if len(fields) not in (3, 4):
                    raise ValueError("expected TOKEN,ROLE,NAME[,TENANT]")
                role = Role(fields[1])
                identity = Identity(role, fields[2], fields[3] if len(fields) == 4 else "")
                table.add(fields[0], identity)
            except (ValueError, IdentityError) as e:
                raise ValueError(f"{path} line {number}: {e}") from None
        return table


def worker_join_identity() -> Identity:
    """What the cluster's join token stands for: a worker that may register any free id."""
    return Identity(Role.WORKER, ANY_WORKER)


class Authenticator:
    def __init__(self, *, tls: bool, tokens: TokenTable | None = None, allow_anonymous: bool = False) -> None:
        self.tls = tls
        self.tokens = tokens or TokenTable()
        self.allow_anonymous = allow_anonymous and not tls
        self._spiffe_cache: dict[bytes, Identity | str] = {}

    def identify(self, context: grpc.aio.ServicerContext) -> Identity:
        """The caller's identity; AuthError(UNAUTHENTICATED) when there is none."""
        token = _bearer(context)
        if token is not None:
            identity = self.tokens.lookup(token)
            if identity is None:
                raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "the bearer token is not known to this server")
            return identity
        if self.tls:
            return self._from_certificate(context)
        if self.allow_anonymous:
            return ANONYMOUS
        raise AuthError(
            grpc.StatusCode.UNAUTHENTICATED,
            "this server runs without TLS and needs a bearer token (a join token for workers, a client or admin token for callers)",
        )

    def _from_certificate(self, context: grpc.aio.ServicerContext) -> Identity:
        ids = (context.auth_context() or {}).get("peer_spiffe_id") or []
        if len(ids) != 1:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "the client certificate carries no spiffe://kvplane/ identity")
        cached = self._spiffe_cache.get(ids[0])
        if cached is None:
            try:
                cached = identity_from_spiffe_id(ids[0].decode(errors="replace"))
            except IdentityError as e:
                cached = str(e)
            if len(self._spiffe_cache) < 10_000:
                self._spiffe_cache[ids[0]] = cached
        if isinstance(cached, str):
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, cached)
        return cached


def _bearer(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == AUTHORIZATION:
            text = value if isinstance(value, str) else value.decode(errors="replace")
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


@dataclass(frozen=True, slots=True)
class Rule:
    """Who may call one method, and whether calls count against the caller's rate limit."""

    roles: frozenset[Role]
    rate_limited: bool = False


def rule(*roles: Role, rate_limited: bool = False) -> Rule:
    return Rule(frozenset(roles), rate_limited)


def peer_host(context: grpc.aio.ServicerContext) -> str:
    peer = context.peer() or ""
    return peer.rpartition(":")[0] or peer


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates, authorizes and rate-limits every call of the services in `policy`."""

    def __init__(self, authenticator: Authenticator, policy: Mapping[str, Rule], limiter: RateLimiter | None = None) -> None:
        self._authenticator = authenticator
        self._policy = dict(policy)
        self._limiter = limiter

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_OPEN_PREFIXES):
            return handler
        return wrap(handler, lambda context: self._admit(method, context))

    async def _admit(self, method: str, context: grpc.aio.ServicerContext) -> None:
        short = method.rpartition("/")[2]
        try:
            identity = self._authenticator.identify(context)
        except AuthError as e:
            await context.abort(e.code, f"{short}: {e}")
        allowed = self._policy.get(method)
        if allowed is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{short} is not open to any caller on this server")
        if identity.role not in allowed.roles:
            needed = " or ".join(sorted(r.value for r in allowed.roles))
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{identity} may not call {short}: it needs the {needed} role")
        if allowed.rate_limited and self._limiter is not None:
            key = identity.key if identity is not ANONYMOUS else f"{identity.key}@{peer_host(context)}"
            wait = self._limiter.acquire(key)
            if wait > 0:
                context.set_trailing_metadata(rejection_trailers(wait, "rate limit"))
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"rate limit: {identity} may send {self._limiter.rate:g} requests/s (bursts of {self._limiter.burst:g}); "
                    f"retry after {math.ceil(wait * 1000)} ms",
                )
        CALLER.set(identity)


def caller() -> Identity | None:
    """The identity the AuthInterceptor admitted for the current call (None outside one)."""
    return CALLER.get()
