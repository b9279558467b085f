"""Tickets: a control plane's signed permission for one request on named workers.

An agent serves Generate/Prefill only with a ticket whose HMAC-SHA256 (key shared through the
store at registration) verifies, that names the agent, and that has not expired, so a client
cannot bypass admission by calling agents directly.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import time

from kvplane.v1 import common_pb2

DEFAULT_TICKET_TTL_S = 300.0


class TicketError(Exception):
    """The ticket is missing, forged, expired or for another worker."""


def _signed_bytes(ticket: common_pb2.Ticket) -> bytes:
    parts = [ticket.request_id, ticket.decode_worker_id, ticket.prefill_worker_id]
    return b"\x00".join(p.encode() for p in parts) + struct.pack("<d", ticket.expires_at)


def issue(
    key: bytes,
    request_id: str,
    decode_worker_id: str,
    prefill_worker_id: str = "",
    ttl_s: float = DEFAULT_TICKET_TTL_S,
) -> common_pb2.Ticket:
    ticket = common_pb2.Ticket(
        request_id=request_id,
        decode_worker_id=decode_worker_id,
        prefill_worker_id=prefill_worker_id,
        expires_at=time.time() + ttl_s,
    )
    ticket.signature = hmac.new(key, _signed_bytes(ticket), hashlib.sha256).digest()
    return ticket


def verify(key: bytes, ticket: common_pb2.Ticket, worker_id: str, now: float | None = None) -> None:
    """Raises TicketError unless `ticket` was signed with `key` for `worker_id` and is still valid."""
    if not ticket.signature:
        raise TicketError("request carries no ticket: send it through a kvplane control plane")
    expected = hmac.new(key, _signed_bytes(ticket), hashlib.sha256).digest()
    if not hmac.compare_digest(expected, ticket.signature):
        raise TicketError("ticket signature does not verify: it was not issued by this cluster's control plane")
    if worker_id not in (ticket.decode_worker_id, ticket.prefill_worker_id):
        raise TicketError(f"ticket is for workers {ticket.decode_worker_id!r}/{ticket.prefill_worker_id!r}, not {worker_id!r}")
    if (now if now is not None else time.time()) > ticket.expires_at:
        raise TicketError("ticket expired: route the request again")
