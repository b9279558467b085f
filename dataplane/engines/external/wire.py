"""The KV-event wire format that vLLM and SGLang publish over ZMQ, decoded into plain records.

A message is three frames: topic, an 8-byte big-endian sequence number, and a msgpack batch
`[ts, events, dp_rank]`. Each event is a map tagged by `type`: `BlockStored` (`block_hashes`,
`parent_block_hash`, `token_ids`, `block_size`, `medium`; SGLang adds `cache_salt`, vLLM puts the
salt in `extra_keys`), `BlockRemoved` (`block_hashes`, `medium`) or `AllBlocksCleared`. Hashes are
the engine's own (64-bit ints, or bytes): opaque keys here; dataplane/engines/external/hash_map.py
translates them. A replay reply carries the same three frames after a routing envelope, and ends
with sequence -1 (both engines' publishers answer a DEALER that sends `["", start_seq]`).

Pure functions (msgpack is the only import): tested against recorded messages.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvplane.types import Tier

END_OF_REPLAY = -1

# The engine's storage medium -> kvplane tier. None (older engines) is the device.
# "EXTERNAL" (SGLang: a shared remote pool such as Mooncake's store) is not this worker's.
_MEDIUM_TO_TIER = {
    None: Tier.DEVICE,
    "GPU": Tier.DEVICE,
    "CPU": Tier.HOST,
    "CPU_PINNED": Tier.HOST,
    "DISK": Tier.DISK,
    "STORAGE": Tier.DISK,
}

EngineHash = Hashable  # an int (vLLM, SGLang) or bytes (vLLM with a bytes hash)


class WireFormatError(ValueError):
    """A message that is not a KV-event batch of the known shape."""


@dataclass(frozen=True, slots=True)
class EngineStored:
    block_hashes: tuple[EngineHash, ...]  # in prefix order
    parent: EngineHash | None  # the block before the first one; None = the prompt's first block
    token_ids: tuple[int, ...]  # block_size tokens per block, concatenated
    block_size: int
    tier: Tier | None  # None: a medium that is not this worker's (ignored)
    cache_salt: str  # the tenant salt of a first block ("" = none)
    lora: str | None = None  # a LoRA adapter's blocks (not the base model's): never mapped


@dataclass(frozen=True, slots=True)
class EngineRemoved:
    block_hashes: tuple[EngineHash, ...]
    tier: Tier | None


@dataclass(frozen=True, slots=True)
class EngineCleared:
    pass


EngineEvent = EngineStored | EngineRemoved | EngineCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    seq: int
    ts: float
    events: tuple[EngineEvent, ...]


def decode_seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise WireFormatError(f"a sequence frame has 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """A live message [topic, seq, payload] (or a replay reply's last three frames)."""
    if len(frames) != 3:
        raise WireFormatError(f"a KV-event message has 3 frames (topic, seq, payload), got {len(frames)}")
    import msgpack  # noqa: PLC0415 (the [engines] extra: only agents beside external engines need it)

    seq = decode_seq(frames[1])
    try:
        batch = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types for garbage
        raise WireFormatError(f"batch {seq}: not msgpack ({e})") from None
    if not isinstance(batch, list | tuple) or len(batch) < 2 or not isinstance(batch[1], list | tuple):
        raise WireFormatError(f"batch {seq}: expected [ts, events, dp_rank], got {type(batch).__name__}")
    return EventBatch(seq=seq, ts=float(batch[0]), events=tuple(decode_event(e, seq) for e in batch[1]))


def decode_event(event: object, seq: int = 0) -> EngineEvent:
    if not isinstance(event, dict):
        raise WireFormatError(f"batch {seq}: an event is a map tagged by 'type', got {type(event).__name__}")
    kind = event.get("type")
    if kind == "BlockStored":
        hashes = tuple(_hash(h) for h in event["block_hashes"])
        token_ids = tuple(int(t) for t in event.get("token_ids") or ())
        block_size = int(event.get("block_size") or 0)
        if block_size <= 0 or len(token_ids) != block_size * len(hashes):
            raise WireFormatError(
                f"batch {seq}: BlockStored of {len(hashes)} blocks of {block_size} tokens carries {len(token_ids)} token ids"
            )
        parent = event.get("parent_block_hash")
        return EngineStored(
            block_hashes=hashes,
            parent=None if parent is None else _hash(parent),
            token_ids=token_ids,
            block_size=block_size,
            tier=_tier(event.get("medium")),
            cache_salt=_salt(event),
            lora=_lora(event),
        )
    if kind == "BlockRemoved":
        return EngineRemoved(tuple(_hash(h) for h in event["block_hashes"]), _tier(event.get("medium")))
    if kind == "AllBlocksCleared":
        return EngineCleared()
    raise WireFormatError(f"batch {seq}: unknown event type {kind!r}")


def _hash(value: object) -> EngineHash:
    if isinstance(value, int | bytes):
        return value
    if isinstance(value, list | tuple):  # msgpack has no tuple; a composite hash arrives as a list
        return tuple(value)
    raise WireFormatError(f"a block hash is an int or bytes, got {type(value).__name__}")


def _tier(medium: object) -> Tier | None:
    return _MEDIUM_TO_TIER.get(medium) if medium is None or isinstance(medium, str) else None


def _lora(event: dict) -> str | None:
    name, lora_id = event.get("lora_name"), event.get("lora_id")
    if name is not None:
        return str(name)
    return None if lora_id in (None, 0) else str(lora_id)


def _salt(event: dict) -> str:
    """SGLang: `cache_salt`. vLLM: the string in the first block's `extra_keys` (after the LoRA
    name when `lora_name` is set; (mm_identifier, offset) pairs are tuples, embedding digests bytes)."""
    salt = event.get("cache_salt")
    if isinstance(salt, str):
        return salt
    extra = event.get("extra_keys")
    if not extra or not extra[0]:
        return ""
    strings = [k for k in extra[0] if isinstance(k, str)]
    if event.get("lora_name") is not None and strings:
        strings = strings[1:]
    return strings[0] if strings else ""
