"""Who is calling: an identity (role, name, tenant) and how it is written into a certificate.

Roles follow the Kubernetes RBAC shape, cut down to what kvplane needs:
- `controlplane`: a control-plane replica (it calls agents; agents take admin calls only from it);
- `worker`: an agent; its name is its worker id (a join token stands for any worker id, "*");
- `client`: a tenant's application; its tenant decides its KV-cache salt;
- `admin`: an operator (config, drain, undrain, profile, cache and stats); it may also generate,
  as tenant "admin:NAME", which no client tenant can spell.

A certificate carries its identity as a SPIFFE ID in its URI SAN (what gRPC reports as
`peer_spiffe_id`): spiffe://kvplane/ROLE/NAME, and for clients spiffe://kvplane/client/TENANT/NAME.
Names and tenants are 1..64 characters of [A-Za-z0-9._-], so no two identities print the same.

The serving roles (control plane, worker) also carry their identity as a DNS name, NAME.ROLE.kvplane
(`server_name`): a gRPC client in Python checks a server's DNS SANs against the name it dials
(`grpc.ssl_target_name_override`) and never its URI SAN, so that name is how an agent makes sure
the peer it dials is the worker a ticket names (kvplane.security.credentials.Credentials.for_peer).
Client and admin certificates carry neither that name nor serverAuth, so they cannot serve.

Cache salts are the tenant's secret: HMAC(the cluster's salt key, tenant), never the tenant name,
so nobody can compute the block hashes of another tenant's prompts (tenant_cache_salt).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
from dataclasses import dataclass

TRUST_DOMAIN = "kvplane"
SPIFFE_PREFIX = f"spiffe://{TRUST_DOMAIN}/"
ANY_WORKER = "*"  # the name a join token gives: it may register any worker id that is free
ANONYMOUS_TENANT = "anonymous"
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
SALT_TAG_BYTES = 16  # of the HMAC that stands for a tenant in its cache salt: 128 bits, unguessable


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

    @property
    def serves(self) -> bool:
        """Whether this identity runs a gRPC server others dial (its certificate has serverAuth)."""
        return self.role in (Role.CONTROLPLANE, Role.WORKER)

    def server_name(self) -> str:
        """The DNS name a server certificate carries for this identity, and that its callers dial
        by (NAME.ROLE.kvplane). Only serving roles have one; gRPC compares it case-insensitively."""
        if not self.serves or self.name == ANY_WORKER:
            raise IdentityError(f"{self} does not serve, so it has no server name")
        return f"{self.name}.{self.role.value}.{TRUST_DOMAIN}"

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


def tenant_cache_salt(identity: Identity, client_salt: str = "", *, key: bytes) -> str:
    """The cache salt of a request: a secret tag of the caller's tenant, then what the client chose.

    Block hashes chain from the salt, so two tenants never share a cached block, and a client salt
    can only split its own tenant's cache further (as vLLM's cache_salt and Dynamo's do), never
    reach into another's. The tag is HMAC-SHA256(key, tenant), cut to SALT_TAG_BYTES and written
    in hex: `key` is the cluster's salt key, which only control-plane replicas hold (all the same
    one, from the store), so nobody else can compute a tenant's salt, nor the block hashes of
    its prompts. Hex has no '/', so the encoding is unambiguous.
    """
    if len(key) < 16:
        raise ValueError("the cache salt key must be at least 16 random bytes")
    tag = hmac.new(key, b"kvplane-cache-salt\x00" + identity.cache_tenant.encode(), hashlib.sha256).digest()
    return f"t/{tag[:SALT_TAG_BYTES].hex()}/{client_salt}"
