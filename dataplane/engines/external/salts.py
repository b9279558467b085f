"""kvplane's cache salts as an engine that restricts them accepts them.

kvplane salts a request with its tenant (`t/TENANT/CLIENT_SALT`, kvplane/security/identity.py: up
to ~320 characters, with '/'), and vLLM refuses a `cache_salt` over 128 characters or holding '/',
'@', '\\' or NUL. The adapter sends a fixed-size alias instead (a digest of the salt: the same salt
always gets the same alias, so the engine's cache sharing is unchanged) and the engine's KV events,
which carry the alias, are mapped back to the salt kvplane's block hashes are rooted in. The alias
of a salt is learnt when a request carrying it is sent, which is before any event for its blocks;
an agent started beside an engine that already caches blocks of older salts cannot map those
until a request with the same salt comes (they count as unmapped, as any block whose root is unknown).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

ALIAS_PREFIX = "kv-"
DEFAULT_MAX_SALTS = 100_000  # distinct salts remembered (least recently used go first)


class EngineSalts:
    __slots__ = ("_alias_to_salt", "_max")

    def __init__(self, max_salts: int = DEFAULT_MAX_SALTS) -> None:
        self._alias_to_salt: OrderedDict[str, str] = OrderedDict()
        self._max = max_salts

    def alias(self, salt: str) -> str:
        """What to send the engine for `salt` ("" stays "": no salt)."""
        if not salt:
            return ""
        alias = ALIAS_PREFIX + hashlib.sha256(salt.encode()).hexdigest()[:48]
        self._alias_to_salt[alias] = salt
        self._alias_to_salt.move_to_end(alias)
        if len(self._alias_to_salt) > self._max:
            self._alias_to_salt.popitem(last=False)
        return alias

    def salt(self, engine_salt: str) -> str:
        """The kvplane salt behind what the engine reports (unchanged when it is no alias of ours)."""
        return self._alias_to_salt.get(engine_salt, engine_salt)
