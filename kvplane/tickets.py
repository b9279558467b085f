"""Tickets: a control plane's signed permission for one operation on named workers.

Signing: Ed25519. Only control-plane replicas hold the private key (they share it through the
store, never through an RPC); agents get the public key at registration and can verify tickets
but not make them, so a registered worker cannot mint tickets for its peers (as it could with the
shared HMAC key of kvplane <= 0.1).

A ticket binds (see Ticket in protos/kvplane/v1/common.proto):
- the operation ("generate", "drain", "undrain", "profile") and the worker(s):
  `decode_worker_id` runs it; for generate, `prefill_worker_id` may prefill or serve KV for it;
- the request: request id, SHA-256 of the prompt token ids, the cache
  salt the control plane derived from the tenant, and the tenant;
- for generate, every field that directs work: the peer to prefill or fetch from (worker, endpoint,
  fetch-only, transport: exactly AgentGenerateRequest.prefill_from, or none), the most tokens to
  generate (what admission charged) and a digest of the other sampling parameters. A lookaside
  client holds its agent request before it runs it: without these it could point the decode
  worker at a server of its own, or run 1,000 tokens on a placement admitted for 1;
- time: issued_at and expires_at, at most MAX_TTL_S apart; agents refuse a ticket issued in the
  future or living longer (beyond CLOCK_SKEW_S), whoever signed it;
- a random nonce: `ReplayGuard` lets each agent accept a nonce once per operation kind.
Agents check the binding against the request they got (`check_request`), so a ticket cannot be
moved to another prompt, salt or worker.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from array import array
from collections.abc import Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kvplane.v1 import common_pb2

MAX_TTL_S = 60.0  # the server-side cap on any ticket's lifetime
DEFAULT_TICKET_TTL_S = 30.0
CLOCK_SKEW_S = 5.0  # control plane and agents run on different clocks

GENERATE, DRAIN, UNDRAIN, PROFILE = "generate", "drain", "undrain", "profile"
OPERATIONS = (GENERATE, DRAIN, UNDRAIN, PROFILE)


class TicketError(Exception):
    """The ticket is missing, forged, expired, replayed or for another request or worker."""


class VerifierNotReady(TicketError):
    """The agent has no key to verify tickets with yet (it has not registered): the worker, not
    the ticket, is at fault, and another worker or a moment later will do."""


def new_signing_key() -> bytes:
    """A fresh Ed25519 private key (32 raw bytes)."""
    return os.urandom(32)


def public_key_of(signing_key: bytes) -> bytes:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    public = Ed25519PrivateKey.from_private_bytes(signing_key).public_key()
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def prompt_digest(token_ids: Sequence[int]) -> bytes:
    return hashlib.sha256(array("I", token_ids).tobytes()).digest()


def _field(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return struct.pack("<I", len(data)) + data


def sampling_digest(s: common_pb2.SamplingParams) -> bytes:
    """SHA-256 of every SamplingParams field but max_tokens (which a ticket bounds instead), in a
    fixed encoding. A field added to SamplingParams must be added here, or a caller could change it."""
    fixed = struct.pack("<ffI??Q", s.temperature, s.top_p, s.top_k, s.ignore_eos, s.HasField("seed"), s.seed)
    stops = array("I", s.stop_token_ids).tobytes()
    return hashlib.sha256(b"kvplane-sampling-v1\x00" + fixed + _field(stops)).digest()


def signed_bytes(t: common_pb2.Ticket) -> bytes:
    """The canonical bytes the signature covers: every field but the signature, length-prefixed."""
    parts = (
        t.operation, t.request_id, t.decode_worker_id, t.prefill_worker_id, t.tenant, t.cache_salt, t.prompt_digest, t.nonce,
        t.prefill_endpoint, t.prefill_transport, t.sampling_digest,
    )  # fmt: skip
    numbers = struct.pack("<dd?I", t.issued_at, t.expires_at, t.prefill_cached_only, t.max_tokens)
    return b"kvplane-ticket-v3\x00" + b"".join(_field(p) for p in parts) + numbers


class TicketSigner:
    """Issues tickets; lives only in control-plane replicas."""

    def __init__(self, signing_key: bytes, ttl_s: float = DEFAULT_TICKET_TTL_S) -> None:
        if not 0 < ttl_s <= MAX_TTL_S:
            raise ValueError(f"ticket TTL must be in (0, {MAX_TTL_S:g}] seconds, got {ttl_s}")
        self._key = Ed25519PrivateKey.from_private_bytes(signing_key)
        self.public_key = public_key_of(signing_key)
        self.ttl_s = ttl_s

    def issue(
        self,
        operation: str,
        worker_id: str,
        *,
        request_id: str = "",
        prefill_worker_id: str = "",
        prompt_token_ids: Sequence[int] | None = None,
        digest: bytes | None = None,
        cache_salt: str = "",
        tenant: str = "",
        prefill_endpoint: str = "",
        prefill_cached_only: bool = False,
        prefill_transport: str = "",
        sampling: common_pb2.SamplingParams | None = None,
        now: float | None = None,
    ) -> common_pb2.Ticket:
        """`prefill_*` name the peer exactly as the agent request's prefill_from does; `sampling`
        the request's as admitted (its max_tokens is the most the request may generate)."""
        if operation not in OPERATIONS:
            raise ValueError(f"unknown ticket operation {operation!r}")
        issued = time.time() if now is None else now
        if digest is None:
            digest = b""
            if prompt_token_ids is not None:
                digest = prompt_digest(prompt_token_ids)
        ticket = common_pb2.Ticket(
            operation=operation, request_id=request_id, decode_worker_id=worker_id, prefill_worker_id=prefill_worker_id,
            tenant=tenant, cache_salt=cache_salt, prompt_digest=digest, nonce=os.urandom(16),
            issued_at=issued, expires_at=issued + self.ttl_s, prefill_endpoint=prefill_endpoint,
            prefill_cached_only=prefill_cached_only, prefill_transport=prefill_transport,
        )  # fmt: skip
        if sampling is not None:
            ticket.max_tokens = sampling.max_tokens
            ticket.sampling_digest = sampling_digest(sampling)
        ticket.signature = self._key.sign(signed_bytes(ticket))
        return ticket

    def issue_generate(self, request, worker_id: str, *, tenant: str = "", now: float | None = None) -> common_pb2.Ticket:
        """The generate ticket for an AgentGenerateRequest as built (everything but its ticket) to
        run on `worker_id`: bound to its request id, prompt, salt, prefill source and sampling."""
        source = request.prefill_from
        return self.issue(
            GENERATE, worker_id, request_id=request.request_id, prefill_worker_id=source.worker_id,
            prompt_token_ids=request.prompt_token_ids, cache_salt=request.cache_salt, tenant=tenant,
            prefill_endpoint=source.endpoint, prefill_cached_only=source.cached_only, prefill_transport=source.transport,
            sampling=request.sampling, now=now,
        )  # fmt: skip


class TicketVerifier:
    """Checks tickets with the control plane's public key; what agents hold."""

    def __init__(self, public_key: bytes) -> None:
        self._key = Ed25519PublicKey.from_public_bytes(public_key) if public_key else None

    def verify(self, ticket: common_pb2.Ticket, operation: str, *, check_expiry: bool = True, now: float | None = None) -> None:
        """Raises TicketError unless `ticket` is a genuine, current ticket for `operation`."""
        if not ticket.signature:
            raise TicketError("the call carries no ticket: send it through a kvplane control plane")
        if self._key is None:
            raise VerifierNotReady("this agent has not registered yet, so it cannot verify tickets; retry shortly")
        try:
            self._key.verify(ticket.signature, signed_bytes(ticket))
        except InvalidSignature:
            raise TicketError("ticket signature does not verify: it was not issued by this cluster's control plane") from None
        if ticket.operation != operation:
            raise TicketError(f"the ticket is for operation {ticket.operation[:16]!r}, not {operation!r}")
        now = time.time() if now is None else now
        if ticket.issued_at > now + CLOCK_SKEW_S or ticket.expires_at - ticket.issued_at > MAX_TTL_S + CLOCK_SKEW_S:
            raise TicketError(f"the ticket's lifetime is outside what a control plane issues (at most {MAX_TTL_S:g} s from now)")
        if check_expiry and now > ticket.expires_at:
            raise TicketError("ticket expired: route the request again")


def check_request(
    ticket: common_pb2.Ticket, *, worker_id: str, as_source: bool = False, request_id: str | None = None,
    prompt_token_ids: Sequence[int] | None = None, digest: bytes | None = None,
    cache_salt: str | None = None, cached_only: bool | None = None, generate=None,
) -> None:  # fmt: skip
    """Raises TicketError unless the ticket names `worker_id` (as the runner, or as the KV source
    with `as_source`) and matches the request's id, prompt, cache salt and, for a
    prefill, whether it only fetches (`cached_only`). `generate`: an AgentGenerateRequest, whose
    prefill source and sampling must be what the ticket names (check_generate)."""
    named = ticket.prefill_worker_id if as_source else ticket.decode_worker_id
    if not named or named != worker_id:
        side = "prefill/KV source" if as_source else "worker"
        raise TicketError(f"the ticket names {named[:64]!r} as its {side}, not this worker {worker_id!r}")
    if request_id is not None and request_id != ticket.request_id:
        raise TicketError("the ticket is for another request id")
    if prompt_token_ids is not None and prompt_digest(prompt_token_ids) != ticket.prompt_digest:
        raise TicketError("the ticket is for another prompt")
    if digest is not None and digest != ticket.prompt_digest:
        raise TicketError("the ticket is for another input")
    if cache_salt is not None and cache_salt != ticket.cache_salt:
        raise TicketError("the ticket is for another cache salt")
    if cached_only is not None and cached_only != ticket.prefill_cached_only:
        raise TicketError(f"the ticket is for a {'fetch of cached blocks' if ticket.prefill_cached_only else 'prefill'}, not this")
    if generate is not None:
        check_generate(ticket, generate)


def check_generate(ticket: common_pb2.Ticket, request) -> None:
    """Raises TicketError unless the AgentGenerateRequest's prefill_from is exactly the peer the
    ticket names (or absent when it names none) and its sampling is what the ticket admitted."""
    source = request.prefill_from if request.HasField("prefill_from") else None
    if source is None:
        if ticket.prefill_worker_id:
            raise TicketError(f"the ticket names {ticket.prefill_worker_id[:64]!r} as prefill peer, the request none")
    elif _source_of(source) != (ticket.prefill_worker_id, ticket.prefill_endpoint, ticket.prefill_cached_only, ticket.prefill_transport):
        raise TicketError("prefill_from is not the peer the ticket names (worker, endpoint, fetch-only and transport must match)")
    if request.sampling.max_tokens > ticket.max_tokens:
        raise TicketError(f"the request asks for {request.sampling.max_tokens} tokens; it was admitted for at most {ticket.max_tokens}")
    if sampling_digest(request.sampling) != ticket.sampling_digest:
        raise TicketError("the request's sampling parameters are not the ones it was admitted with")


def _source_of(source) -> tuple[str, str, bool, str]:
    return source.worker_id, source.endpoint, source.cached_only, source.transport


class ReplayGuard:
    """Remembers the nonces of accepted tickets until they expire, so each is used once.

    Bounded: entries leave when their ticket expires (at most MAX_TTL_S + CLOCK_SKEW_S); past
    `max_entries` live tickets, new ones are refused rather than older ones forgotten.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self._expiry: dict[tuple[str, bytes], float] = {}
        self._max_entries = max_entries

    def use(self, ticket: common_pb2.Ticket, use: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if len(self._expiry) >= self._max_entries // 2:
            self._expiry = {k: t for k, t in self._expiry.items() if t >= now}
        key = (use, ticket.nonce)
        if key in self._expiry:
            raise TicketError(f"this ticket was already used for {use}: tickets are single use; route the request again")
        if len(self._expiry) >= self._max_entries:
            raise TicketError("too many tickets in flight on this worker; retry shortly")
        self._expiry[key] = ticket.expires_at + CLOCK_SKEW_S

    def __len__(self) -> int:
        return len(self._expiry)
