"""The store seam: everything control-plane replicas share goes through this interface.

The semantics are etcd v3's, so the embedded memory backend and the etcd backend are
interchangeable:
- Every write that changes something advances one global revision; all changes made by one
  transaction (or one lease expiry) share that revision. Reads report the revision they saw.
- A watch delivers events in revision order. Passing `start_revision` replays history from that
  revision (inclusive), so "list at revision R, then watch from R + 1" misses nothing. History is
  bounded: a start revision older than the compaction floor raises `StoreCompacted`.
- Keys put under a lease are deleted, with ordinary DELETE events, when the lease expires or is
  revoked. Comparisons on a missing key see version/create_revision/mod_revision 0, and a value
  comparison on a missing key is always false (as in etcd).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from kvplane.types import LeaseId

CompareTarget = Literal["value", "version", "mod_revision", "create_revision"]
CompareOp = Literal["==", "!=", "<", ">"]

_TARGETS = ("value", "version", "mod_revision", "create_revision")
_OPS = ("==", "!=", "<", ">")


class StoreError(RuntimeError):
    """A store operation failed; the message says what to do about it."""


class StoreUnavailable(StoreError):
    """The store could not be reached (network, server down, timeout)."""


class StoreCompacted(StoreError):
    """A watch asked for history older than what the store still keeps."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class LeaseNotFound(StoreError):
    """A write referenced a lease that expired or was revoked."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int  # 1 on creation, +1 per put; a delete resets it
    lease: LeaseId | None


class EventType(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    key: str
    value: bytes  # b"" for deletes
    mod_revision: int
    lease: LeaseId | None = None  # a put's lease (None: none, or a delete)


@dataclass(frozen=True, slots=True)
class Compare:
    """One guard of a transaction: `<target of key> <op> <operand>`."""

    key: str
    target: CompareTarget
    op: CompareOp
    operand: bytes | int

    def __post_init__(self) -> None:
        if self.target not in _TARGETS:
            raise ValueError(f"compare target {self.target!r} is not one of {_TARGETS}")
        if self.op not in _OPS:
            raise ValueError(f"compare op {self.op!r} is not one of {_OPS}")
        if self.target == "value":
            if not isinstance(self.operand, bytes):
                raise TypeError(f"a value comparison needs a bytes operand, got {type(self.operand).__name__}")
        elif isinstance(self.operand, bool) or not isinstance(self.operand, int):
            raise TypeError(f"a {self.target} comparison needs an int operand, got {type(self.operand).__name__}")

    @classmethod
    def value(cls, key: str, op: CompareOp, operand: bytes) -> Compare:
        return cls(key, "value", op, operand)

    @classmethod
    def version(cls, key: str, op: CompareOp, operand: int) -> Compare:
        return cls(key, "version", op, operand)

    @classmethod
    def mod_revision(cls, key: str, op: CompareOp, operand: int) -> Compare:
        return cls(key, "mod_revision", op, operand)

    @classmethod
    def create_revision(cls, key: str, op: CompareOp, operand: int) -> Compare:
        return cls(key, "create_revision", op, operand)

    @classmethod
    def absent(cls, key: str) -> Compare:
        """True when the key does not exist (create-if-absent guards)."""
        return cls(key, "version", "==", 0)

    @classmethod
    def exists(cls, key: str) -> Compare:
        return cls(key, "version", ">", 0)


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: LeaseId | None = None

    def __post_init__(self) -> None:
        # Checked here so both backends reject the same inputs (etcd would fail inside protobuf).
        if not isinstance(self.key, str):
            raise TypeError(f"store keys are str, got {type(self.key).__name__}")
        if not isinstance(self.value, bytes):
            raise TypeError(f"the value for {self.key!r} must be bytes, got {type(self.value).__name__}; encode it first")


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    prefix: bool = False  # True deletes every key starting with `key`


Op = Put | Delete


def check_ops(ops: Sequence[Op]) -> None:
    """Reject a transaction branch that writes one key twice, as etcd does for both backends."""
    put_keys: set[str] = set()
    for op in ops:
        if not isinstance(op, (Put, Delete)):
            raise TypeError(f"transaction operations must be Put or Delete, got {type(op).__name__}")
        if isinstance(op, Put):
            if op.key in put_keys:
                raise ValueError(f"transaction puts key {op.key!r} twice in one branch; merge the two puts")
            put_keys.add(op.key)
    for op in ops:
        if isinstance(op, Delete):
            clash = [k for k in put_keys if (k.startswith(op.key) if op.prefix else k == op.key)]
            if clash:
                raise ValueError(
                    f"transaction both puts and deletes key {sorted(clash)[0]!r} in one branch; keep only the operation you mean"
                )


def compare_holds(compare: Compare, kv: KeyValue | None) -> bool:
    """Evaluate one guard against the key's current state (None when the key is absent)."""
    if compare.target == "value":
        if kv is None:
            return False  # etcd: a value comparison on a missing key never succeeds
        actual: bytes | int = kv.value
    elif kv is None:
        actual = 0
    else:
        actual = getattr(kv, compare.target)
    operand = compare.operand
    if compare.op == "==":
        return actual == operand
    if compare.op == "!=":
        return actual != operand
    if compare.op == "<":
        return actual < operand  # type: ignore[operator]
    return actual > operand  # type: ignore[operator]


class Store(Protocol):
    async def get(self, key: str) -> KeyValue | None: ...

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Items sorted by key, and the store revision they were read at."""
        ...

    async def put(self, key: str, value: bytes, lease: LeaseId | None = None) -> int:
        """Returns the revision of this write. Raises LeaseNotFound for a dead lease."""
        ...

    async def delete(self, key: str) -> bool: ...

    async def delete_prefix(self, prefix: str) -> int: ...

    async def transaction(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> bool:
        """Atomically apply `success` if every guard holds, else `failure`; True on success."""
        ...

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> AsyncGenerator[WatchEvent, None]:
        """Events under `prefix` in revision order.

        The watch is established when iteration starts; without `start_revision` it sees writes
        from then on, so pass `start_revision` (e.g. a listing's revision + 1) when a gap matters.
        Iteration ends cleanly when the store is closed; the generator's `aclose()` or cancelling the consuming
        task releases the watch. Raises StoreCompacted for a start revision that is too old.
        """
        ...

    async def compact(self, revision: int) -> None:
        """Drop history older than `revision`; watches may no longer start before it."""
        ...

    async def lease_grant(self, ttl_seconds: int) -> LeaseId: ...

    async def lease_keepalive(self, lease: LeaseId) -> int:
        """Renew the lease; returns its TTL in seconds, or 0 when the lease is gone."""
        ...

    async def lease_revoke(self, lease: LeaseId) -> None:
        """Delete the lease and its keys now. Revoking a lease that is already gone is a no-op."""
        ...

    async def close(self) -> None: ...


def check_start_revision(start_revision: int | None) -> None:
    if start_revision is not None and start_revision < 1:
        raise ValueError(f"start_revision must be >= 1 (or None for 'from now'), got {start_revision}")


def check_ttl(ttl_seconds: int) -> None:
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds < 1:
        raise ValueError(f"lease TTL must be a whole number of seconds >= 1, got {ttl_seconds!r}")


def compacted_message(prefix: str, start_revision: int, compact_revision: int) -> str:
    return (
        f"cannot watch {prefix!r} from revision {start_revision}: history before revision "
        f"{compact_revision} has been compacted; re-list with get_prefix() and watch from "
        "the listing's revision + 1"
    )
