"""kvplane's tenant salts as vLLM accepts them, and back from its KV events."""

from __future__ import annotations

from kvplane.dataplane.engines.external.salts import EngineSalts
from kvplane.security.identity import Identity, Role, tenant_cache_salt

KEY = bytes(range(32))  # a cluster's cache-salt key


def test_an_alias_is_what_vllm_accepts_stable_and_maps_back():
    salts = EngineSalts()
    salt = tenant_cache_salt(Identity(Role.CLIENT, "app", "tenant-a"), "x" * 256, key=KEY)  # "/" and 291 characters
    alias = salts.alias(salt)
    assert len(alias) <= 128 and not set(alias) & set("@/\\\0")
    assert salts.alias(salt) == alias and salts.salt(alias) == salt
    assert salts.alias(tenant_cache_salt(Identity(Role.CLIENT, "app", "tenant-b"), "x" * 256, key=KEY)) != alias
    assert salts.alias("") == "" and salts.salt("") == ""
    assert salts.salt("not-ours") == "not-ours"


def test_the_least_recently_used_salts_are_forgotten_first():
    salts = EngineSalts(max_salts=2)
    a, b = salts.alias("t/a/"), salts.alias("t/b/")
    salts.alias("t/a/")  # used again
    salts.alias("t/c/")
    assert (salts.salt(a), salts.salt(b)) == ("t/a/", b)
