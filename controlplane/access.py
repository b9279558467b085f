"""Who may call what on a control plane: the access policy its AuthInterceptor enforces.

Clients and admins may generate, route and list workers; everything that changes the cluster or
shows more than the caller's own requests (config, drain, undrain, profile, the cache index, per-
worker statistics) needs an admin. Registry calls need a worker identity; the servicer then checks
that a worker acts only for its own id and registration. Client-API calls count against the
caller's rate limit.
"""

from __future__ import annotations

from kvplane.security.auth import Rule, rule
from kvplane.security.identity import Role
from kvplane.v1 import client_pb2, registry_pb2

_KVPLANE = client_pb2.DESCRIPTOR.services_by_name["Kvplane"].full_name
_REGISTRY = registry_pb2.DESCRIPTOR.services_by_name["Registry"].full_name

CLIENT_METHODS = ("Generate", "Route", "ListWorkers")
ADMIN_METHODS = ("GetCache", "GetStats", "GetConfig", "SetConfig", "DrainWorker", "UndrainWorker", "ProfileWorker")
REGISTRY_METHODS = ("Register", "KeepAlive", "KeepAliveStream", "ReportLoad", "ReportLoadStream", "PublishKVEvents", "Deregister")


def policy() -> dict[str, Rule]:
    table = {f"/{_KVPLANE}/{m}": rule(Role.CLIENT, Role.ADMIN, rate_limited=True) for m in CLIENT_METHODS}
    # The HTTP face's own calls without a caller token (/v1/models, /health) list workers as the replica.
    table[f"/{_KVPLANE}/ListWorkers"] = rule(Role.CLIENT, Role.ADMIN, Role.CONTROLPLANE, rate_limited=True)
    # Lookaside reports follow a Route that was already counted: not rate-limited again.
    table[f"/{_KVPLANE}/Report"] = table[f"/{_KVPLANE}/ReportStream"] = rule(Role.CLIENT, Role.ADMIN)
    table |= {f"/{_KVPLANE}/{m}": rule(Role.ADMIN, rate_limited=True) for m in ADMIN_METHODS}
    table |= {f"/{_REGISTRY}/{m}": rule(Role.WORKER) for m in REGISTRY_METHODS}
    return table
