"""Who is calling: an identity (role, name, tenant) and how it is written into a certificate.

Roles follow the Kubernetes RBAC shape, cut down to what kvplane needs:
- `controlplane`: a control-plane replica (it calls agents; agents take admin calls only from it);
- `worker`: an agent; its name is its worker id (a join token stands for any worker id, "*");
- `client`: a tenant's application; its tenant decides its KV-cache salt;
- `admin`: an operator (config, drain, undrain, profile, cache and stats); it may also generate,
  as tenant "admin:NAME", which no client tenant can spell.

A certificate carries its identity as a SPIFFE ID in its URI SAN (what gRPC reports as
`peer_spiffe_id`): spiffe://kvplane/ROLE/NAME, and for clients spiffe://kvplane/client/TENANT/NAME.
Names and tenants are 1..64 characters of [A-Za-z0-9._-], so no two identities print the same and
none can inject a separator into the cache salt.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

TRUST_DOMAIN = "kvplane"
SPIFFE_PREFIX = f"spiffe://{TRUST_DOMAIN}/"
ANY_WORKER = "*"  # the name a join token gives: it may register any worker id that is free
ANONYMOUS_TENANT = "anonymous"
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class IdentityError(ValueError):
    """A certificate or token does not carry a usable kvplane identity."""


class Role(enum.StrEnum):
    CONTROLPLANE = "controlplane"
    WORKER = "worker"
    CLIENT = "client"
    ADMIN = "admin"


def check_name(value: str, what: str = "name") -> str:
    if not _NAME.match(value):
        raise IdentityError(f"{what} must be 1-64 characters of letters, digits, '.', '_' or '-'; got {value[:80]!r}")
    return value


@dataclass(frozen=True, slots=True)
class Identity:
    role: Role
    name: str
    tenant: str = ""  # clients only; derived for admins and anonymous callers

    def __post_init__(self) -> None:
        if not (self.role is Role.WORKER and self.name == ANY_WORKER):
            check_name(self.name)
        if self.role is Role.CLIENT:
            check_name(self.tenant, "tenant")
        elif self.tenant:
            raise IdentityError(f"only client identities name a tenant, not {self.role.value}")

    @property
    def cache_tenant(self) -> str:
        """The tenant whose cache namespace this identity's requests use."""
        if self.role is Role.CLIENT:
            return self.tenant
        return f"{self.role.value}:{self.name}"  # ':' never appears in a client tenant

    @property
    def key(self) -> str:
        """A stable string naming this identity (rate-limit buckets, logs)."""
        return f"{self.role.value}/{self.tenant + '/' if self.tenant else ''}{self.name}"

    def spiffe_id(self) -> str:
        if self.role is Role.CLIENT:
            return f"{SPIFFE_PREFIX}client/{self.tenant}/{self.name}"
        return f"{SPIFFE_PREFIX}{self.role.value}/{self.name}"

    def __str__(self) -> str:
        return self.key


ANONYMOUS = Identity(Role.CLIENT, "anonymous", ANONYMOUS_TENANT)


def identity_from_spiffe_id(spiffe_id: str) -> Identity:
    """Parses spiffe://kvplane/ROLE/NAME (clients: .../client/TENANT/NAME)."""
    if not spiffe_id.startswith(SPIFFE_PREFIX):
        raise IdentityError(f"certificate identity {spiffe_id[:120]!r} is not in the {TRUST_DOMAIN!r} trust domain")
    parts = spiffe_id[len(SPIFFE_PREFIX) :].split("/")
    try:
        role = Role(parts[0])
    except ValueError:
        raise IdentityError(f"certificate identity {spiffe_id[:120]!r} names no kvplane role {[r.value for r in Role]}") from None
    if role is Role.CLIENT:
        if len(parts) != 3:
            raise IdentityError(f"a client certificate identity is {SPIFFE_PREFIX}client/TENANT/NAME, got {spiffe_id[:120]!r}")
        return Identity(role, check_name(parts[2]), check_name(parts[1], "tenant"))
    if len(parts) != 2:
        raise IdentityError(f"certificate identity is {SPIFFE_PREFIX}ROLE/NAME, got {spiffe_id[:120]!r}")
    return Identity(role, check_name(parts[1]))


def tenant_cache_salt(identity: Identity, client_salt: str = "") -> str:
    """The cache salt of a request: the caller's tenant, then what the client chose.

    Block hashes chain from the salt, so two tenants never share a cached block, and a client salt
    can only split its own tenant's cache further (as vLLM's cache_salt and Dynamo's do), never
    reach into another's. No tenant contains '/', so the encoding is unambiguous.
    """
    return f"t/{identity.cache_tenant}/{client_salt}"
