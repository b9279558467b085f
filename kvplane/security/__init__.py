"""Transport security, identities and limits, shared by every kvplane process (docs/security.md).

- `identity`: roles, identities, their SPIFFE IDs, and the tenant-derived cache salt;
- `certs`: a development CA and per-component certificates (`kvplane certs`);
- `credentials`: the one `Credentials` type servers, agents and clients use, and where clients find theirs;
- `local`: throw-away credentials for a cluster on one machine (`kvplane up`, tests);
- `auth`: server-side authentication (certificate or bearer token), per-method roles, rate limits;
- `flags`: the --tls-* / --insecure / token flags of the servers and the CLI;
- `limits`: the bounds every server enforces.

Channel and server construction lives in kvplane.grpc_util and takes a `Credentials`.
"""

from kvplane.security.credentials import Credentials, CredentialsError, resolve_client
from kvplane.security.identity import ANONYMOUS, Identity, IdentityError, Role, tenant_cache_salt

__all__ = [
    "ANONYMOUS",
    "Credentials",
    "CredentialsError",
    "Identity",
    "IdentityError",
    "Role",
    "resolve_client",
    "tenant_cache_salt",
]
