"""Disaggregation through SGLang's own KV transfer: the bootstrap handoff (pure).

SGLang's protocol: a prefill server (--disaggregation-mode prefill) and a decode server
(--disaggregation-mode decode) with the same transfer backend (mooncake or nixl) both receive the
request with the same `bootstrap_host` / `bootstrap_port` (the prefill server's bootstrap server)
and `bootstrap_room` (a number naming this transfer). The prefill server computes the KV and
pushes it to the decode server that joined the room; the decode server waits for it, then
decodes. SGLang's router sends both requests at once. kvplane's control plane picks the pair and
the decode agent asks the prefill agent: the prefill agent's adapter picks a fresh room, starts
the prefill request on its engine (which waits for the decode side to join) and hands
{host, port, room} back at once; the decode agent's adapter sends its engine the request with
the same three. The handoff is that JSON.
"""

from __future__ import annotations

import json
import random

from kvplane.dataplane.engines.request import EngineInputError

TRANSPORT_PREFIX = "engine:sglang-"
_ROOM_LIMIT = 1 << 31  # bootstrap_room is an int32 in the scheduler API


def transport(backend: str) -> str:
    """Workers pair only with workers of the same transfer backend."""
    return TRANSPORT_PREFIX + backend


def new_handoff(host: str, port: int, rng: random.Random) -> dict:
    return {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": rng.randrange(_ROOM_LIMIT)}


def encode(handoff: dict) -> bytes:
    return json.dumps(handoff, sort_keys=True).encode()


def decode(params: bytes) -> dict:
    """The DisaggregatedParams fields of a handoff; EngineInputError if malformed."""
    try:
        handoff = json.loads(params)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EngineInputError(f"the KV handoff is not SGLang bootstrap JSON: {e}") from None
    if (
        not isinstance(handoff, dict)
        or not isinstance(handoff.get("bootstrap_host"), str)
        or not isinstance(handoff.get("bootstrap_port"), int)
        or not isinstance(handoff.get("bootstrap_room"), int)
        or not 0 <= handoff["bootstrap_room"] < _ROOM_LIMIT
    ):
        raise EngineInputError(f"the KV handoff is not {{bootstrap_host: str, bootstrap_port: int, bootstrap_room: int32}}: {handoff!r}")
    return {k: handoff[k] for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")}
